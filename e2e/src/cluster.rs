//! Using the node as a user would: kubectl and Helm with the admin kubeconfig, the operator
//! installed from the release in the node's registry (`helm install oci://…`, images pulled from
//! there), and task namespaces that enforce Pod Security `restricted`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Services;
use crate::process::obtain;
use crate::registry::Release;
use crate::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};

thread_local! {
    /// The task namespaces made on this thread: a test's, since libtest runs each test on a
    /// thread of its own.
    static MADE_HERE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The task namespaces [`Cluster::task_namespace`] made on this thread since the last call: a
/// binary whose tests share one node deletes them when each test ends, so that the pods a test
/// leaves running do not take the node's CPU from the tests after it.
pub fn namespaces_made_here() -> Vec<String> {
    MADE_HERE.with(|made| std::mem::take(&mut *made.borrow_mut()))
}

/// The namespace the operator is installed in, and its Helm release.
pub const OPERATOR_NAMESPACE: &str = "perago-system";
pub const RELEASE: &str = "perago";
/// The namespace label that lets pods read the operator's metrics under
/// [`Cluster::network_policy_values`].
pub const SCRAPER_LABEL: (&str, &str) = ("perago.io/e2e-scraper", "true");
/// The operator's Deployment, as the chart names it.
pub const OPERATOR_DEPLOYMENT: &str = "perago-operator";
/// The operator's ValidatingWebhookConfiguration, as the chart names it.
pub const WEBHOOK_CONFIGURATION: &str = "perago-operator";
/// The Secret with the lakeFS key in each task namespace.
pub const LAKEFS_SECRET: &str = "lakefs-credentials";

pub struct Cluster {
    kubectl: PathBuf,
    helm: PathBuf,
    kubeconfig: PathBuf,
    repo: PathBuf,
    conductor_url: String,
    lakefs_endpoint: String,
    /// `host:port` of lakeFS's object store, on the PostgreSQL + S3 profile.
    object_store: Option<String>,
    release: Release,
}

impl Cluster {
    pub fn new(services: &Services) -> Result<Self> {
        if services.node.is_none() {
            bail!("the cluster helpers need the node (Selection::ALL)");
        }
        Ok(Self {
            kubectl: obtain("kubectl")?,
            helm: obtain("helm")?,
            kubeconfig: services.kube().kubeconfig.clone(),
            repo: Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
            conductor_url: services.conductor().api_url.clone(),
            lakefs_endpoint: services.lakefs().endpoint.clone(),
            object_store: Some(services.lakefs().object_store_hosts()).filter(|h| !h.is_empty()),
            release: services.node().release.clone(),
        })
    }

    fn command(&self, binary: &Path, args: &[&str]) -> Result<String> {
        let out = Command::new(binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .current_dir(&self.repo)
            .output()
            .with_context(|| format!("running {}", binary.display()))?;
        let name = binary.file_name().unwrap_or_default().to_string_lossy();
        if !out.status.success() {
            bail!(
                "{name} {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The admin kubeconfig of the node.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `kubectl <args>` in the repository; its standard output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.command(&self.kubectl, args)
    }

    /// `helm <args>` in the repository; its standard output.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        self.command(&self.helm, args)
    }

    /// `kubectl apply -f -` of a manifest.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        let mut child = Command::new(&self.kubectl)
            .args(["apply", "--server-side", "-f", "-"])
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(
            child.stdin.as_mut().context("kubectl has no stdin")?,
            manifest.as_bytes(),
        )?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl apply failed: {}\n{manifest}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl wait` until the PeragoTask is Ready (two minutes at most).
    pub fn wait_ready(&self, namespace: &str, name: &str) -> Result<String> {
        self.kubectl(&[
            "wait",
            "-n",
            namespace,
            "--for=condition=Ready",
            &format!("peragotask/{name}"),
            "--timeout=120s",
        ])
    }

    /// Apply `manifests` as if they were stored before the admission webhook existed: its
    /// configuration is set aside meanwhile and restored (with its `caBundle`) afterwards.
    pub fn apply_without_webhook(&self, manifests: &[String]) -> Result<()> {
        let saved = self.kubectl(&[
            "get",
            "validatingwebhookconfiguration",
            WEBHOOK_CONFIGURATION,
            "-o",
            "json",
        ])?;
        let mut saved: serde_json::Value = serde_json::from_str(&saved)?;
        if let Some(metadata) = saved["metadata"].as_object_mut() {
            for field in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
                "generation",
            ] {
                metadata.remove(field);
            }
        }
        self.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            WEBHOOK_CONFIGURATION,
        ])?;
        let applied: Result<Vec<String>> = manifests.iter().map(|m| self.apply(m)).collect();
        self.apply(&saved.to_string())?;
        applied.map(|_| ())
    }

    /// A namespace enforcing Pod Security `restricted`, as production namespaces should.
    pub fn restricted_namespace(&self, name: &str) -> Result<()> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n    \
             pod-security.kubernetes.io/enforce-version: latest\n"
        ))?;
        Ok(())
    }

    /// A restricted namespace for PeragoTasks, with the lakeFS key their pods use. Its name is
    /// kept for [`namespaces_made_here`].
    pub fn task_namespace(&self, name: &str) -> Result<()> {
        MADE_HERE.with(|made| made.borrow_mut().push(name.to_owned()));
        self.restricted_namespace(name)?;
        self.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {LAKEFS_SECRET}\n  namespace: {name}\n\
             stringData:\n  LAKECTL_CREDENTIALS_ACCESS_KEY_ID: {LAKEFS_ACCESS_KEY_ID}\n  \
             LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY: {LAKEFS_SECRET_ACCESS_KEY}\n"
        ))?;
        Ok(())
    }

    /// The release in the node's registry that installs come from.
    pub fn release(&self) -> &Release {
        &self.release
    }

    /// `helm install oci://…` of the released chart (its images pulled from the node's
    /// registry), pointed at the harness's Conductor and lakeFS on the bridge address, waiting
    /// until the operator is available. Returns how long the install took.
    pub fn install_operator(&self, extra: &[&str]) -> Result<Duration> {
        self.install_release(&self.release, extra)
    }

    /// [`Self::install_operator`] of another release in the node's registry.
    pub fn install_release(&self, release: &Release, extra: &[&str]) -> Result<Duration> {
        self.install_as(RELEASE, OPERATOR_NAMESPACE, release, extra)
    }

    /// [`Self::install_release`] as Helm release `name` in `namespace` (made restricted).
    pub fn install_as(
        &self,
        name: &str,
        namespace: &str,
        release: &Release,
        extra: &[&str],
    ) -> Result<Duration> {
        let started = Instant::now();
        self.restricted_namespace(namespace)?;
        let sets = self.release_values();
        let mut args = vec![
            "install",
            name,
            &release.chart,
            "--version",
            &release.version,
            "--plain-http",
            "--namespace",
            namespace,
            "--wait",
            "--timeout",
            "180s",
        ];
        for set in &sets {
            args.extend(["--set", set]);
        }
        args.extend(extra);
        self.helm(&args).with_context(|| {
            let pods = self
                .kubectl(&["get", "pods", "-n", namespace, "-o", "wide"])
                .unwrap_or_default();
            let events = self
                .kubectl(&["get", "events", "-n", namespace])
                .unwrap_or_default();
            format!("the operator did not become available:\n{pods}\n{events}")
        })?;
        Ok(started.elapsed())
    }

    /// Until the admission webhook answers through its Service (a server-side dry run of a
    /// PeragoTask is admitted), two minutes at most: after a rollout of the operator, the
    /// apiserver may still call a pod that is gone.
    pub fn wait_for_webhook(&self) -> Result<()> {
        let probe = "apiVersion: perago.io/v1alpha1\nkind: PeragoTask\nmetadata: {name: webhook-probe, namespace: default}\n\
             spec: {taskName: webhook.probe, ownerEmail: probe@example.com, paramsSchema: {type: object}, \
             resultSchema: {type: object}, executor: {body: {image: busybox, command: [sh]}}}\n";
        let path =
            std::env::temp_dir().join(format!("perago-webhook-probe-{}.yaml", std::process::id()));
        std::fs::write(&path, probe)?;
        let started = Instant::now();
        let answered = loop {
            match self.kubectl(&["apply", "--dry-run=server", "-f", &path.to_string_lossy()]) {
                Ok(_) => break Ok(()),
                Err(e) if started.elapsed() > Duration::from_secs(120) => {
                    break Err(e.context("the admission webhook never answered"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        };
        let _ = std::fs::remove_file(&path);
        answered
    }

    /// Helm arguments that confine the pods to what they need on this node (with a
    /// [`crate::policies::PolicyEnforcer`] running): every executor pod's NetworkPolicy lets
    /// it reach Conductor's, lakeFS's and the object store's ports on the node, where they
    /// listen, and DNS, nothing else; the operator's pods let in the webhook's callers and, on
    /// the metrics port, their own and the namespaces labelled [`SCRAPER_LABEL`] only.
    pub fn network_policy_values(&self) -> Result<Vec<String>> {
        let port = |url: &str| -> Result<u16> {
            reqwest::Url::parse(url)?
                .port_or_known_default()
                .with_context(|| format!("{url} has no port"))
        };
        let object_store = self.object_store.as_ref().map(|h| format!("http://{h}"));
        let ports: Vec<_> = [&self.conductor_url, &self.lakefs_endpoint]
            .into_iter()
            .chain(object_store.as_ref())
            .map(|url| port(url).map(|port| serde_json::json!({"port": port, "protocol": "TCP"})))
            .collect::<Result<_>>()?;
        let servers = serde_json::json!([{
            "to": [{"ipBlock": {"cidr": format!("{}/32", crate::node::BRIDGE_IP)}}],
            "ports": ports,
        }]);
        let (label, value) = SCRAPER_LABEL;
        let scrapers = serde_json::json!([{"namespaceSelector": {"matchLabels": {label: value}}}]);
        Ok(vec![
            "--set".into(),
            "executorNetworkPolicy.enabled=true".into(),
            "--set-json".into(),
            format!("executorNetworkPolicy.egress={servers}"),
            "--set".into(),
            "networkPolicy.enabled=true".into(),
            "--set-json".into(),
            format!("networkPolicy.metricsFrom={scrapers}"),
        ])
    }

    /// The chart values every install here sets: the harness's servers (the images are the
    /// released chart's own).
    fn release_values(&self) -> Vec<String> {
        vec![
            format!("conductor.url={}", self.conductor_url),
            format!("lakefs.endpoint={}", self.lakefs_endpoint),
            format!("lakefs.credentialsSecret={LAKEFS_SECRET}"),
        ]
    }

    /// The chart's staging-branch CronJob (`stagingGc`) for `repositories`, rendered with the
    /// release's values and applied in the operator's namespace (with the lakeFS key it
    /// reads), then run once now as a Job made from it. Returns the Job's log.
    pub fn run_staging_gc(&self, job: &str, repositories: &[&str]) -> Result<String> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {LAKEFS_SECRET}\n  namespace: {OPERATOR_NAMESPACE}\n\
             stringData:\n  LAKECTL_CREDENTIALS_ACCESS_KEY_ID: {LAKEFS_ACCESS_KEY_ID}\n  \
             LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY: {LAKEFS_SECRET_ACCESS_KEY}\n"
        ))?;
        let mut sets = self.release_values();
        sets.push("stagingGc.enabled=true".into());
        sets.push(format!(
            "stagingGc.repositories={{{}}}",
            repositories.join(",")
        ));
        let mut args = vec![
            "template",
            RELEASE,
            &self.release.chart,
            "--version",
            &self.release.version,
            "--plain-http",
            "--namespace",
            OPERATOR_NAMESPACE,
            "--kube-version",
            "v1.35.0",
            "--show-only",
            "templates/staging-gc.yaml",
        ];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let cronjob = self.helm(&args)?;
        self.apply(&cronjob)?;
        let cronjob_name = format!("cronjob/{OPERATOR_DEPLOYMENT}-staging-gc");
        self.kubectl(&[
            "create",
            "job",
            "-n",
            OPERATOR_NAMESPACE,
            job,
            "--from",
            &cronjob_name,
        ])?;
        let job_ref = format!("job/{job}");
        let waited = self.kubectl(&[
            "wait",
            "-n",
            OPERATOR_NAMESPACE,
            "--for=condition=complete",
            "--timeout=120s",
            &job_ref,
        ]);
        let logs = self
            .kubectl(&["logs", "-n", OPERATOR_NAMESPACE, &job_ref])
            .unwrap_or_default();
        waited.with_context(|| {
            let describe = self
                .kubectl(&["describe", "-n", OPERATOR_NAMESPACE, &job_ref])
                .unwrap_or_default();
            format!("the staging-gc job did not complete:\n{logs}\n{describe}")
        })?;
        Ok(logs)
    }

    /// `kubectl rollout restart` of a one-replica operator, so that the benchmark that follows
    /// sees a fresh process (its peak memory is that run's); returns the metrics URL of the new
    /// process once it leads and the admission webhook answers.
    pub async fn restart_operator(&self, client: &kube::Client) -> Result<String> {
        let deployment = format!("deployment/{OPERATOR_DEPLOYMENT}");
        self.kubectl(&["-n", OPERATOR_NAMESPACE, "rollout", "restart", &deployment])?;
        self.kubectl(&[
            "-n",
            OPERATOR_NAMESPACE,
            "rollout",
            "status",
            &deployment,
            "--timeout=180s",
        ])?;
        self.operator_metrics(client).await
    }

    /// The apiserver's own metrics (`/metrics`, Prometheus text), through `client`.
    pub async fn apiserver_metrics(client: &kube::Client) -> Result<String> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        Ok(client.request_text(request).await?)
    }

    /// The metrics URL of the one operator pod, once it leads and the admission webhook
    /// answers (180 s at most).
    pub async fn operator_metrics(&self, client: &kube::Client) -> Result<String> {
        let started = Instant::now();
        let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
            client.clone(),
            OPERATOR_NAMESPACE,
        );
        let selector =
            kube::api::ListParams::default().labels("app.kubernetes.io/name=perago-operator");
        loop {
            let listed = pods.list(&selector).await?.items;
            let live: Vec<_> = listed
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            // The old process is gone once one operator pod is left, and the new one leads
            // once the old one's lease has expired.
            if let [pod] = live.as_slice()
                && let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone())
            {
                let metrics = format!("http://{ip}:8080/metrics");
                if leading(&metrics).await {
                    // Blocking, as the kubectl calls above are: `block_in_place` would panic
                    // on the current-thread runtime of a `#[tokio::test]`.
                    self.wait_for_webhook()?;
                    return Ok(metrics);
                }
            }
            if started.elapsed() > Duration::from_secs(180) {
                bail!("no single operator pod leads after 180 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The operator's logs (every replica), for checks such as "no Forbidden".
    pub fn operator_logs(&self) -> Result<String> {
        self.kubectl(&[
            "logs",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=perago-operator",
            "--tail=-1",
            "--prefix",
        ])
    }
}

/// Whether the operator serving `metrics` holds the leader lease.
async fn leading(metrics: &str) -> bool {
    match reqwest::get(metrics).await {
        Ok(r) => r
            .text()
            .await
            .is_ok_and(|t| t.lines().any(|l| l == "perago_operator_leader 1")),
        Err(_) => false,
    }
}
