//! What a body cannot reach: the sidecar's credentials, and what the NetworkPolicies refuse.

use super::*;

/// What a body can read, printed to its log: its environment, every process it can see (with
/// its command line and environment), the files of the work volume and of /etc/perago, and
/// whether a ServiceAccount token is mounted. The section markers are printed with `printf`,
/// so that the script's own command line, which the report holds, does not contain them.
const SNOOPING_BODY: &str = r#"
printf "== %s\n" environment
env
printf "== %s\n" processes
for p in /proc/[0-9]*; do
  echo "-- $p: $(cat "$p/cmdline" 2>/dev/null)"
  cat "$p/environ" 2>/dev/null
  echo
done
dump() {
  for f in "$1"/* "$1"/.[!.]*; do
    if [ "$f" = /perago-work/bin/perago-runner ]; then
      echo "-- $f (the runner)"
    elif [ -L "$f" ]; then
      echo "-- $f (link)"
    elif [ -d "$f" ]; then
      dump "$f"
    elif [ -f "$f" ]; then
      echo "-- $f"
      head -c 65536 "$f" 2>&1
      echo
    elif [ -e "$f" ]; then
      echo "-- $f (not a file)"
    fi
  done
}
printf "== %s\n" files
dump /perago-work
dump /etc/perago
dump /var/run/secrets
printf "== %s\n" end
printf '{"files": 0}' > "$PERAGO_RESULT"
"#;

/// The threat model's promise (docs/threat-model.md): the body container cannot read the
/// lakeFS credentials the sidecar holds: not in its environment, not through the processes it
/// can see, not in the shared work volume, and it has no ServiceAccount token.
#[tokio::test]
async fn the_body_cannot_read_the_sidecars_credentials() {
    let Some((_turn, services, cluster)) =
        cluster("the_body_cannot_read_the_sidecars_credentials").await
    else {
        return;
    };
    let (namespace, name) = ("pods-snoop", "snoop");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(&workspace_task(namespace, name, SNOOPING_BODY))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (_lake, repository, input_ref) = seeded(services, "pods-snoop").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "snoop",
        &repository,
        &input_ref,
        0,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    assert_eq!(finished["tasks"][0]["status"], "COMPLETED", "{finished}");
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name)
        .await
        .metadata
        .name
        .unwrap();
    let log = cluster
        .kubectl(&["logs", "-n", namespace, &pod, "-c", "body"])
        .unwrap();
    let seen = log
        .split_once("== environment")
        .and_then(|(_, rest)| rest.split_once("== end"))
        .map(|(seen, _)| seen)
        .unwrap_or_else(|| panic!("the body's report is incomplete:\n{log}"));
    // The report works: the body sees its own environment, its own processes and the attempt's
    // files in the work volume.
    for own in [
        "PERAGO_WORKSPACE=",
        "perago-runner",
        "/perago-work/",
        "in.txt",
    ] {
        assert!(seen.contains(own), "the report lacks {own:?}:\n{seen}");
    }
    // And none of it is the sidecar's: not its credentials, not its process.
    let secret = perago_e2e::services::LAKEFS_SECRET_ACCESS_KEY;
    for hidden in [secret, "LAKECTL_CREDENTIALS", "serviceaccount/token"] {
        assert!(
            !seen.contains(hidden),
            "the body can read {hidden:?}:\n{seen}"
        );
    }
    let processes = seen
        .split_once("== processes")
        .and_then(|(_, rest)| rest.split_once("== files"))
        .unwrap()
        .0;
    assert!(
        !processes.contains("perago-sidecar"),
        "the body sees the sidecar's process:\n{processes}"
    );
}

/// What a pod reaches: `open` when an HTTP server answered on the host and port, `closed`
/// when the connection was refused or timed out.
const REACH: &str = r#"reach() {
  if printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$1" "$2" 2>/dev/null | head -c 12 | grep -q HTTP; then
    echo open
  else
    echo closed
  fi
}
"#;

/// Host and port of an `http(s)://host:port/…` URL.
fn address(url: &str) -> (String, u16) {
    let url = reqwest::Url::parse(url).unwrap();
    (
        url.host_str().unwrap().to_owned(),
        url.port_or_known_default().unwrap(),
    )
}

/// Under the chart's NetworkPolicies (enforced on the node by kube-router), an executor pod
/// reaches lakeFS and Conductor and publishes, but neither the API server nor the operator;
/// only pods of a scraper namespace read the operator's metrics. A task that switches its
/// policy off gets it removed, and its pods reach the API server again.
#[tokio::test]
async fn network_policies_confine_executor_pods_and_the_operator() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use perago_e2e::cluster::{OPERATOR_NAMESPACE, SCRAPER_LABEL};

    let Some((_turn, services, cluster)) =
        cluster("network_policies_confine_executor_pods_and_the_operator").await
    else {
        return;
    };
    let (namespace, name) = ("pods-netpol", "netpol");
    cluster.task_namespace(namespace).unwrap();
    let client = services.kube().client().await.unwrap();
    let operator = Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=perago-operator"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("an operator pod with an IP");
    let (lakefs_host, lakefs_port) = address(&services.lakefs().endpoint);
    let (api_host, api_port) = address(&services.kube().server);
    let script = format!(
        "{REACH}printf '{{\"lakefs\": \"%s\", \"apiserver\": \"%s\", \"operator\": \"%s\"}}' \
         \"$(reach {lakefs_host} {lakefs_port})\" \"$(reach {api_host} {api_port})\" \
         \"$(reach {operator} 8080)\" > \"$PERAGO_RESULT\"\n"
    );
    let task = workspace_task_with(
        namespace,
        name,
        &script,
        &json!({"resultSchema": {
            "properties": {
                "files": null,
                "lakefs": {"type": "string"},
                "apiserver": {"type": "string"},
                "operator": {"type": "string"},
            },
            "required": ["lakefs", "apiserver", "operator"],
        }}),
    );
    cluster.apply(&task).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    let policy = policies.get("netpol-perago").await.unwrap();
    assert_eq!(
        policy.spec.unwrap().policy_types.unwrap(),
        ["Ingress", "Egress"]
    );

    let (_lake, repository, input_ref) = seeded(services, "pods-netpol").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let reached = async |case: &str| {
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            case,
            &repository,
            &input_ref,
            1,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{step}");
        step["outputData"]["result"].clone()
    };
    assert_eq!(
        reached("confined").await,
        json!({"lakefs": "open", "apiserver": "closed", "operator": "closed"}),
        "the executor pod, under its NetworkPolicy"
    );

    // The operator's metrics: read from a pod of a scraper namespace, refused to one elsewhere.
    let scrapers = "pods-netpol-scraper";
    let (label, value) = SCRAPER_LABEL;
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {scrapers}\n  labels: {{{label}: \"{value}\"}}\n"
        ))
        .unwrap();
    for ns in [scrapers, namespace] {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: scraper, namespace: {ns}}}\nspec:\n  \
                 securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  \
                 containers:\n  - name: c\n    image: {BUSYBOX_BODY_IMAGE}\n    imagePullPolicy: Never\n    \
                 command: [sleep, '3600']\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n"
            ))
            .unwrap();
    }
    let probe = format!("{REACH}reach {operator} 8080");
    let read_from = |ns: &str| {
        cluster
            .kubectl(&["exec", "-n", ns, "scraper", "--", "sh", "-c", &probe])
            .unwrap()
            .trim()
            .to_owned()
    };
    for ns in [scrapers, namespace] {
        cluster
            .kubectl(&[
                "wait",
                "-n",
                ns,
                "--for=condition=Ready",
                "pod/scraper",
                "--timeout=60s",
            ])
            .unwrap();
    }
    // The enforcer adds a new pod's address to the policy's allowed sources on its own time,
    // after the pod is Ready: the scraper is let in within a bound, not at once.
    let ready = std::time::Instant::now();
    while read_from(scrapers) != "open" {
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "a pod of {scrapers} still cannot read the operator's metrics 30 s after it was Ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "the scraper read the operator's metrics {:.1?} after it was Ready",
        ready.elapsed()
    );
    assert_eq!(
        read_from(namespace),
        "closed",
        "the operator's metrics from {namespace}, not a scraper namespace"
    );

    // Switched off: the operator removes the policy, and the pod reaches the API server (the
    // operator's own policy still refuses it).
    cluster
        .kubectl(&[
            "patch",
            "peragotask",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            r#"{"spec": {"executor": {"networkPolicy": {"enabled": false}}}}"#,
        ])
        .unwrap();
    let started = std::time::Instant::now();
    while policies.get_opt("netpol-perago").await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the NetworkPolicy is still there 30 s after the task switched it off"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let removed = started.elapsed();
    // The enforcer follows the deletion on its own time: until the body's container reaches
    // the API server, the next attempt would not.
    let pod = task_pod(&client, namespace, name).await;
    let pod = pod.metadata.name.unwrap();
    let probe = format!("{REACH}reach {api_host} {api_port}");
    loop {
        let out = cluster
            .kubectl(&[
                "exec", "-n", namespace, &pod, "-c", "body", "--", "sh", "-c", &probe,
            ])
            .unwrap();
        if out.trim() == "open" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the pod still cannot reach the API server 60 s after its task switched its \
             NetworkPolicy off"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "NetworkPolicy removed {removed:.1?} after the task switched it off, lifted on the node \
         {:.1?} after that",
        started.elapsed() - removed
    );
    assert_eq!(
        reached("unconfined").await,
        json!({"lakefs": "open", "apiserver": "open", "operator": "closed"}),
        "the executor pod, without its NetworkPolicy"
    );
    for ns in [scrapers, namespace] {
        let _ = cluster.kubectl(&["delete", "pod", "-n", ns, "scraper", "--wait=false"]);
    }
}
