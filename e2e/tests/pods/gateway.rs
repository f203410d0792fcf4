//! Conductor and lakeFS behind an authenticating gateway, on the node: Debian's nginx with
//! `ssl_verify_client on` in front of the harness's servers, on the bridge address where pods
//! reach them. The operator presents the chart's `conductor.clientCertificateRef` to it; each
//! task's sidecar presents its own `spec.*.tls.clientCertificateRef`, a Secret mounted into
//! the sidecar alone. The body beside it shares the pod's network and is refused.

use super::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use perago_e2e::cluster::OPERATOR_NAMESPACE;
use perago_e2e::gateway::{Gateway, Request};
use perago_e2e::node::BRIDGE_IP;
use perago_e2e::pki::{Authority, Pair, Usage};
use std::collections::BTreeSet;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The gateway of this test binary, and the authority of the client certificates it admits.
pub struct Rig {
    gateway: Gateway,
    clients: Authority,
    /// Conductor's API through the gateway (`https://…/api`).
    conductor: String,
    /// lakeFS through the gateway.
    lakefs: String,
}

static RIG: OnceCell<Rig> = OnceCell::const_new();

/// The ConfigMap (in the operator's namespace and each task's) with the gateway's authority.
const GATEWAY_CA: &str = "gateway-ca";
/// The Secret of the operator's own client certificate.
const OPERATOR_CLIENT: &str = "operator-client";

/// The gateway, started on first use.
pub async fn rig(services: &'static Services) -> &'static Rig {
    RIG.get_or_init(|| async {
        let dir = services.dir().join("gateway");
        let serving = Authority::create_named(&dir.join("serving"), "gateway-ca").unwrap();
        let clients = Authority::create_named(&dir.join("clients"), "sidecars-ca").unwrap();
        let conductor = services
            .conductor()
            .api_url
            .trim_end_matches("/api")
            .to_owned();
        let gateway = Gateway::start(
            &dir.join("nginx"),
            services.host,
            &serving,
            &clients.cert,
            &[&conductor, &services.lakefs().endpoint],
        )
        .await
        .unwrap();
        Rig {
            conductor: format!("{}/api", gateway.urls[0]),
            lakefs: gateway.urls[1].clone(),
            gateway,
            clients,
        }
    })
    .await
}

/// The operator's Helm values for the gateway: it trusts the gateway's server and presents a
/// certificate of its own, as a platform whose Conductor sits behind one installs it. Its
/// calls to the harness's Conductor, plain HTTP, are the same with them.
pub fn operator_values(cluster: &Cluster, rig: &Rig) -> Vec<String> {
    cluster.restricted_namespace(OPERATOR_NAMESPACE).unwrap();
    rig.trust(cluster, OPERATOR_NAMESPACE);
    let pair = rig.certificate("operator", "perago-operator");
    cluster
        .apply(&tls_secret(OPERATOR_NAMESPACE, OPERATOR_CLIENT, &pair))
        .unwrap();
    [
        format!("conductor.caBundleRef.configMap.name={GATEWAY_CA}"),
        format!("conductor.clientCertificateRef.name={OPERATOR_CLIENT}"),
    ]
    .into_iter()
    .flat_map(|set| ["--set".to_owned(), set])
    .collect()
}

impl Rig {
    /// A client certificate of the admitted authority (`<name>.crt`, `<name>.key`) for `cn`.
    fn certificate(&self, name: &str, cn: &str) -> Pair {
        self.clients
            .issue(name, cn, &Usage::Client { org: None })
            .unwrap()
    }

    /// The gateway's authority as the ConfigMap [`GATEWAY_CA`] of `namespace`.
    fn trust(&self, cluster: &Cluster, namespace: &str) {
        let pem = std::fs::read_to_string(&self.gateway.serving_ca).unwrap();
        let config_map = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": GATEWAY_CA, "namespace": namespace},
            "data": {"ca.crt": pem},
        });
        cluster.apply(&config_map.to_string()).unwrap();
    }

    /// A workspace task on Conductor and lakeFS through the gateway, presenting the Secret
    /// `certificate` when given, its pods allowed to the gateway's ports; `spec` merged in.
    fn task(
        &self,
        namespace: &str,
        name: &str,
        script: &str,
        certificate: Option<&str>,
        spec: &serde_json::Value,
    ) -> String {
        let mut tls = json!({"caBundleRef": {"configMap": {"name": GATEWAY_CA}}});
        if let Some(secret) = certificate {
            tls["clientCertificateRef"] = json!({"name": secret});
        }
        let ports: Vec<_> = self
            .gateway
            .urls
            .iter()
            .map(|url| json!({"port": reqwest::Url::parse(url).unwrap().port(), "protocol": "TCP"}))
            .collect();
        let mut own = json!({
            "conductor": {"url": self.conductor, "tls": tls},
            "lakefs": {"endpoint": self.lakefs, "tls": tls},
            "executor": {"networkPolicy": {"egress": [{
                "to": [{"ipBlock": {"cidr": format!("{BRIDGE_IP}/32")}}],
                "ports": ports,
            }]}},
        });
        merge(&mut own, spec);
        workspace_task_with(namespace, name, script, &own)
    }

    /// The gateway's requests from `client` (a pod's address).
    fn requests_from(&self, client: &str) -> Vec<Request> {
        self.gateway
            .requests()
            .into_iter()
            .filter(|r| r.client == client)
            .collect()
    }
}

/// A `kubernetes.io/tls` Secret holding `pair`, as cert-manager writes one.
fn tls_secret(namespace: &str, name: &str, pair: &Pair) -> String {
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap();
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"tls.crt": read(&pair.cert), "tls.key": read(&pair.key)},
    })
    .to_string()
}

/// The certificate's serial as OpenSSL, and so nginx's `$ssl_client_serial`, prints it.
fn serial(pair: &Pair) -> String {
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(&pair.cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .trim_start_matches("serial=")
        .to_owned()
}

/// The PeragoTask's `Ready` condition once its message contains `text`.
async fn ready_saying(client: &kube::Client, namespace: &str, name: &str, text: &str) -> Condition {
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    for _ in 0..1200 {
        last = tasks
            .get(name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"));
        if let Some(c) = last.as_ref().filter(|c| c.message.contains(text)) {
            return c.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{namespace}/{name}: Ready never said {text:?}; last {last:?}");
}

/// A hostile body, in Python (busybox's wget speaks no TLS that nginx's OpenSSL accepts): it
/// polls the queue of the task type its params name (`victim`) at the Conductor API they name
/// (`url`), as any Conductor client may, and completes what it gets with a made-up output.
/// What happened goes to `report.txt` in its workspace and to its result: `refused` (an HTTP
/// error), `failed` (no answer), `empty` (nothing was queued) or `completed` (it completed
/// another task type's attempt). It has no client certificate to present.
const INTRUDER_BODY: &str = r#"
import json, os, ssl, urllib.error, urllib.request

params = json.load(open(os.environ["PERAGO_PARAMS"]))
url = params["url"]
# Whatever certificate the gateway serves: this body has none of its own to present.
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
report = []


def call(method, path, body=None):
    report.append(f"{method} {url}{path}")
    request = urllib.request.Request(url + path, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        text = response.read().decode()
    report.append(f"HTTP {response.status}: {text[:200]}")
    return text


try:
    polled = call("GET", f"/tasks/poll/{params['victim']}?workerid=intruder")
    if not polled.strip():
        outcome = "empty"
    else:
        task = json.loads(polled)
        update = {
            "taskId": task["taskId"],
            "workflowInstanceId": task["workflowInstanceId"],
            "workerId": "intruder",
            "status": "COMPLETED",
            "outputData": {"forged": True},
        }
        call("POST", "/tasks", json.dumps(update).encode())
        outcome = "completed"
except urllib.error.HTTPError as e:
    report.append(f"HTTP {e.code}: {e.read().decode(errors='replace')}")
    outcome = "refused"
except OSError as e:
    report.append(f"failed: {e}")
    outcome = "failed"
report.append(f"outcome: {outcome}")
with open(os.path.join(os.environ["PERAGO_WORKSPACE"], "report.txt"), "w") as f:
    f.write("\n".join(report) + "\n")
with open(os.environ["PERAGO_RESULT"], "w") as f:
    json.dump({"outcome": outcome}, f)
"#;

/// The threat model's hole, closed on the node: a body whose own sidecar passes the gateway
/// with its certificate polls another task type's queue through the gateway and is refused,
/// and that attempt completes through its own pod. The same body against Conductor without the
/// gateway completes the other task type's attempt with a made-up output: what the gateway
/// prevents, and what would make this test fail. A task without a certificate is not Ready,
/// and its condition and `kubectl perago status` say the gateway refused it.
#[tokio::test]
async fn the_gateway_admits_the_sidecar_and_refuses_the_body_beside_it() {
    let Some((_turn, services, cluster)) =
        cluster("the_gateway_admits_the_sidecar_and_refuses_the_body_beside_it").await
    else {
        return;
    };
    let rig = rig(services).await;
    let namespace = "pods-gateway";
    let victim = format!("{namespace}.victim");
    cluster.task_namespace(namespace).unwrap();
    rig.trust(cluster, namespace);
    for name in ["victim", "intruder"] {
        let pair = rig.certificate(name, &format!("{namespace}.{name}"));
        cluster
            .apply(&tls_secret(namespace, &format!("{name}-client"), &pair))
            .unwrap();
    }
    // The victim starts with no pod, so that its attempts wait in the queue for whoever polls.
    cluster
        .apply(&rig.task(
            namespace,
            "victim",
            PUBLISH_BODY,
            Some("victim-client"),
            &json!({"executor": {"replicas": 0}}),
        ))
        .unwrap();
    let python = super::python_body_image(services).await;
    cluster
        .apply(&rig.task(
            namespace,
            "intruder",
            "",
            Some("intruder-client"),
            &json!({
                "paramsSchema": {
                    "properties": {"n": null, "url": {"type": "string"}, "victim": {"type": "string"}},
                    "required": ["url", "victim"],
                },
                "resultSchema": {"properties": {"files": null, "outcome": {"type": "string"}}, "required": ["outcome"]},
                "executor": {"body": {"image": python, "command": ["python", "-c", INTRUDER_BODY]}},
            }),
        ))
        .unwrap();
    cluster
        .apply(&rig.task(namespace, "uncertified", PUBLISH_BODY, None, &json!({})))
        .unwrap();
    // The operator registered both TaskDefs through the gateway with its own certificate.
    cluster.wait_ready(namespace, "victim").unwrap();
    cluster.wait_ready(namespace, "intruder").unwrap();
    let requests = rig.gateway.requests();
    assert!(
        requests.iter().any(|r| r.subject == "CN=perago-operator"
            && r.verify == "SUCCESS"
            && r.request.contains("/api/metadata/taskdefs")),
        "the operator's TaskDef calls through the gateway: {requests:?}"
    );

    let (lake, repository, input_ref) = seeded(services, "pods-gateway").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let step_input = |branch: &str, params: serde_json::Value| {
        json!({
            "workspace": {"repository": repository, "branch": branch, "refType": "commit", "ref": input_ref},
            "params": params,
        })
    };
    // One intruder attempt against the Conductor API at `url`, on a branch of its own: its
    // result and its report.
    let intrude = async |case: &str, url: &str| {
        lake.post(
            &format!("/repositories/{repository}/branches"),
            json!({"name": case, "source": input_ref}),
        )
        .await
        .unwrap();
        let workflow = conductor
            .start(
                &format!("{namespace}.intruder"),
                case,
                step_input(case, json!({"url": url, "victim": victim})),
            )
            .await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{step}");
        assert!(served_by(step, "intruder"), "{step}");
        let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
        let report = lake
            .object(&repository, head, "data/report.txt")
            .await
            .unwrap();
        eprintln!("the intruder's report, {case}:\n{report}");
        (step["outputData"]["result"]["outcome"].clone(), report)
    };

    // Without the gateway the hole is there: the body takes the victim's waiting attempt and
    // completes it with its made-up output.
    let stolen = conductor
        .start(&victim, "stolen", step_input("main", json!({"n": 1})))
        .await;
    let (outcome, report) = intrude("direct", &services.conductor().api_url).await;
    assert_eq!(outcome, "completed", "{report}");
    let stolen = conductor.finished(&stolen).await;
    let step = &stolen["tasks"][0];
    assert_eq!(
        (
            &step["status"],
            &step["workerId"],
            &step["outputData"]["forged"]
        ),
        (&json!("COMPLETED"), &json!("intruder"), &json!(true)),
        "{step}"
    );

    // Through the gateway, the same body is refused, and the attempt waits for its own pod.
    let kept = conductor
        .start(&victim, "kept", step_input("main", json!({"n": 1})))
        .await;
    let (outcome, report) = intrude("through-the-gateway", &rig.conductor).await;
    assert_eq!(outcome, "refused", "{report}");
    assert!(
        report.contains("HTTP 400: ") && report.contains("No required SSL certificate was sent"),
        "{report}"
    );
    let waiting = conductor.workflow(&kept).await;
    assert_eq!(waiting["tasks"][0]["status"], "SCHEDULED", "{waiting}");
    assert_eq!(waiting["tasks"][0]["pollCount"], 0, "{waiting}");
    // The gateway saw the body's poll without a certificate, from the same pod address as its
    // sidecar's admitted calls.
    let client = services.kube().client().await.unwrap();
    let intruder_ip = task_pod(&client, namespace, "intruder")
        .await
        .status
        .and_then(|s| s.pod_ip)
        .unwrap();
    let seen = rig.requests_from(&intruder_ip);
    let poll = format!("GET /api/tasks/poll/{victim}?workerid=intruder ");
    let refused: Vec<_> = seen
        .iter()
        .filter(|r| r.request.starts_with(&poll))
        .collect();
    assert!(
        !refused.is_empty()
            && refused
                .iter()
                .all(|r| r.verify == "NONE" && r.status == 400),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|r| r.verify == "SUCCESS"
            && r.subject == format!("CN={namespace}.intruder")
            && r.status == 200),
        "the intruder's sidecar passes the gateway from the same address: {seen:?}"
    );
    cluster
        .kubectl(&[
            "scale",
            "peragotask",
            "victim",
            "-n",
            namespace,
            "--replicas=1",
        ])
        .unwrap();
    let kept = conductor.finished(&kept).await;
    let step = &kept["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    assert!(served_by(step, "victim"), "{step}");
    assert_eq!(step["outputData"]["result"], json!({"files": 1}), "{step}");

    // Without a certificate the task's sidecar is refused at start; the task says so.
    let refusal = "the gateway requires a client certificate and none was sent";
    let condition = ready_saying(&client, namespace, "uncertified", refusal).await;
    assert_eq!(condition.status, "False", "{condition:?}");
    assert!(
        condition
            .message
            .contains("spec.conductor.tls.clientCertificateRef"),
        "{}",
        condition.message
    );
    eprintln!("without a certificate: {}", condition.message);
    // kubectl perago status shows it, and reads the queue through the gateway with a
    // certificate of its own (without one, it is refused too).
    let admin = rig.certificate("admin", "platform-admin");
    let ca = rig.gateway.serving_ca.display().to_string();
    let (cert, key) = (
        admin.cert.display().to_string(),
        admin.key.display().to_string(),
    );
    let status = |certificate: &[&str]| {
        let mut args = vec!["status", "uncertified", "-n", namespace, "--ca-file", &ca];
        args.extend(certificate);
        args.extend(["-o", "json"]);
        let out = plugin(cluster, &args);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    // The condition names the sidecar's last exit while its restart backs off; between
    // restarts it may say something else for a moment.
    let ready = |view: &serde_json::Value| {
        view["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default()
    };
    let asked = Instant::now();
    let view = loop {
        let view = status(&["--client-cert", &cert, "--client-key", &key]);
        if ready(&view)["message"]
            .as_str()
            .is_some_and(|m| m.contains(refusal))
        {
            break view;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "kubectl perago status never showed the refusal: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(ready(&view)["status"], "False", "{view:#}");
    assert_eq!(
        (&view["queue"]["name"], &view["queue"]["queued"]),
        (&json!(format!("{namespace}.uncertified")), &json!(0)),
        "the queue, read through the gateway with kubectl perago's certificate: {view:#}"
    );
    let unread = status(&[])["unread"].clone();
    assert!(
        unread.as_array().unwrap().iter().any(|line| line
            .as_str()
            .is_some_and(|l| l.starts_with("queue: ")
                && l.contains("the gateway requires a client certificate"))),
        "without a certificate, kubectl perago is refused too: {unread:#}"
    );
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Workflows run on a task behind the gateway while its Secret is replaced by a renewed
/// certificate of the same authority: none is lost, and the sidecar presents the new serial
/// once the kubelet has brought the files into the pod. How long the kubelet takes is
/// measured on the node's disk and printed; the sidecar's part is bounded by its reload
/// interval (ADR 0036).
#[tokio::test]
async fn a_renewed_client_certificate_is_presented_while_workflows_run() {
    use perago_e2e::workload::Workload;
    const WORKFLOWS: usize = 20;
    /// The sidecar reads the files again at most every second (ADR 0036,
    /// `perago_contract::trust::RELOAD_EVERY`); a request it starts a second after they changed
    /// presents the new certificate. Half a second more for the request to reach nginx.
    const RELOAD_BOUND: f64 = 1.5;

    let Some((_turn, services, cluster)) =
        cluster("a_renewed_client_certificate_is_presented_while_workflows_run").await
    else {
        return;
    };
    let rig = rig(services).await;
    let (namespace, name) = ("pods-gateway-renew", "renewed");
    cluster.task_namespace(namespace).unwrap();
    rig.trust(cluster, namespace);
    let cn = format!("{namespace}.{name}");
    let (first, second) = (
        rig.certificate("renewed-1", &cn),
        rig.certificate("renewed-2", &cn),
    );
    let (old, new) = (serial(&first), serial(&second));
    let secret = "renewed-client";
    cluster
        .apply(&tls_secret(namespace, secret, &first))
        .unwrap();
    // Two slots, and three seconds per attempt: the workflows outlast the kubelet's delay
    // (its sync period, 10 s on the node, and up to half as much again), so that attempts run
    // on both sides of the renewal.
    let body = "set -eu; sleep 3; echo \"run $PERAGO_WORKFLOW_INSTANCE_ID\" > \"$PERAGO_WORKSPACE/out.txt\"; \
                printf '{\"files\": 1}' > \"$PERAGO_RESULT\"";
    cluster
        .apply(&rig.task(
            namespace,
            name,
            body,
            Some(secret),
            &json!({"executor": {"slots": 2}}),
        ))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let ip = pod.status.and_then(|s| s.pod_ip).unwrap();
    // Where the node's kubelet keeps the Secret's files for the sidecar (its --root-dir).
    let mounted = services
        .dir()
        .join("node/kubelet/pods")
        .join(&uid)
        .join("volumes/kubernetes.io~secret")
        .join(perago_api::pod::CONDUCTOR_CLIENT_CERT_VOLUME)
        .join("tls.crt");
    let renewed_pem = std::fs::read_to_string(&second.cert).unwrap();
    assert_eq!(
        std::fs::read_to_string(&mounted).unwrap(),
        std::fs::read_to_string(&first.cert).unwrap(),
        "{}",
        mounted.display()
    );

    let (lake, repository, input_ref) = seeded(services, "pods-gateway-renew").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workload = Workload::start(
        &lake,
        &conductor,
        &format!("{namespace}.{name}"),
        (&repository, &input_ref),
        "renew",
        WORKFLOWS,
    )
    .await
    .unwrap();
    // Renewed once attempts are under way.
    let unfinished = loop {
        let finished = workload.finished(&conductor).await;
        if finished >= 2 {
            break WORKFLOWS - finished;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let replaced = SystemTime::now();
    cluster
        .apply(&tls_secret(namespace, secret, &second))
        .unwrap();
    let watching = Instant::now();
    while std::fs::read_to_string(&mounted).unwrap_or_default() != renewed_pem {
        assert!(
            watching.elapsed() < Duration::from_secs(120),
            "the kubelet did not update {} within 120 s of the Secret's change",
            mounted.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let in_pod = SystemTime::now();
    workload
        .wait_finished(&conductor, Duration::from_secs(180))
        .await
        .unwrap();
    let outcome = workload.outcome(&lake, &conductor).await.unwrap();
    assert!(outcome.holds_the_promises(), "{outcome}");
    assert_eq!(
        (outcome.completed, outcome.failed_attempts),
        (WORKFLOWS, 0),
        "{outcome}"
    );
    // A few idle polls more after the bound, for the requests under the new certificate to be
    // many whenever the workflows ended.
    let (replaced, in_pod) = (unix_seconds(replaced), unix_seconds(in_pod));
    let bound = in_pod + RELOAD_BOUND;
    while unix_seconds(SystemTime::now()) < bound + 3.0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Attempts that began once the sidecar presented the new certificate.
    let mut renewed_attempts = 0;
    for (id, _) in &workload.workflows {
        let started = conductor.workflow(id).await["tasks"][0]["startTime"]
            .as_f64()
            .unwrap_or_default();
        renewed_attempts += usize::from(started / 1000.0 >= bound);
    }
    assert!(
        renewed_attempts > 0,
        "every attempt began before the new certificate was in use: the renewal did not land \
         while the workflows ran ({unfinished} unfinished when the Secret was replaced)"
    );

    let requests = rig.requests_from(&ip);
    assert!(
        requests.iter().all(|r| r.verify == "SUCCESS"),
        "every request of the pod passed: {:?}",
        requests.iter().find(|r| r.verify != "SUCCESS")
    );
    let serials = |keep: &dyn Fn(&Request) -> bool| -> BTreeSet<&str> {
        requests
            .iter()
            .filter(|r| keep(r))
            .map(|r| r.serial.as_str())
            .collect()
    };
    assert_eq!(
        serials(&|r| r.time < replaced),
        BTreeSet::from([old.as_str()]),
        "before the renewal"
    );
    let after: Vec<_> = requests.iter().filter(|r| r.started() >= bound).collect();
    assert!(after.len() > 5, "{after:?}");
    assert_eq!(
        serials(&|r| r.started() >= bound),
        BTreeSet::from([new.as_str()]),
        "requests started {RELOAD_BOUND} s after the kubelet updated the files: {:?}",
        after.iter().find(|r| r.serial != new)
    );
    let first_new = requests
        .iter()
        .filter(|r| r.serial == new)
        .map(Request::started)
        .fold(f64::MAX, f64::min);
    let log = cluster
        .kubectl(&["logs", "-n", namespace, &pod_name, "-c", "perago-sidecar"])
        .unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("the client certificate changed") && l.contains(&new)),
        "{log}"
    );
    eprintln!(
        "{outcome}; the Secret replaced with {unfinished} of {WORKFLOWS} workflows unfinished; \
         the kubelet updated the pod's files {:.1} s later; the sidecar first presented the new \
         serial {:.2} s after that ({:.1} s after the Secret's change); {renewed_attempts} \
         attempts began after that, {} requests since",
        in_pod - replaced,
        first_new - in_pod,
        first_new - replaced,
        after.len()
    );
}
