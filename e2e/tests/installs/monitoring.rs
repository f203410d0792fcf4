//! The operator's and the executor pods' metrics as users collect them: a real Prometheus
//! scrapes the node with the jobs that the chart's ServiceMonitor and PodMonitor make (the
//! Prometheus Operator's relabeling, over the targets Kubernetes discovery would find: see
//! `perago_e2e::prometheus`), and the scaler queries of docs/autoscaling.md (KEDA's,
//! prometheus-adapter's rule) answer with the PeragoTask's own figures; prometheus-adapter,
//! run with that rule, feeds the example HPA, which scales a task. The chart's
//! `tracing.otlpEndpoint` sends each attempt's trace to a real OpenTelemetry Collector.

use perago_e2e::cluster::{Cluster, OPERATOR_NAMESPACE, RELEASE};
use perago_e2e::collector::Collector;
use perago_e2e::node::{BRIDGE_IP, BUSYBOX_BODY_IMAGE};
use perago_e2e::pod::ConductorApi;
use perago_e2e::prometheus::{Discovery, Prometheus, pod_monitor_jobs, service_monitor_jobs};
use perago_e2e::{Selection, shared};
use serde_json::{Value, json};

use super::{Turn, delete_tasks, uninstall};

const NAMESPACE: &str = "monitoring";

/// A workspace-free task of `replicas` pods whose body answers at once, or fails when its
/// params say `fail`; no retries.
fn task(name: &str, replicas: i32) -> String {
    let body = "grep -q fail \"$PERAGO_PARAMS\" && exit 3; echo '{}' > \"$PERAGO_RESULT\"";
    task_with_body(name, replicas, body)
}

fn task_with_body(name: &str, replicas: i32, body: &str) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "taskName": format!("{NAMESPACE}.{name}"),
            "ownerEmail": "e2e@example.com",
            "paramsSchema": {"type": "object"},
            "resultSchema": {"type": "object"},
            "controls": {"retry": {"count": 0}},
            "executor": {
                "replicas": replicas,
                "body": {"image": BUSYBOX_BODY_IMAGE, "command": ["sh", "-c", body]},
            },
        },
    }))
    .unwrap()
}

/// The chart's metrics Service, ServiceMonitor, PodMonitor, Grafana dashboard and
/// PrometheusRule, as Helm renders them with all enabled.
fn chart_monitors(cluster: &Cluster) -> (Value, Value, Value, Value, Value) {
    let rendered = cluster
        .helm(&[
            "template",
            RELEASE,
            "charts/perago-operator",
            "--namespace",
            OPERATOR_NAMESPACE,
            "--kube-version",
            "1.33.0",
            "--set",
            "conductor.url=http://conductor/api",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "grafana.dashboard.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
            "--show-only",
            "templates/service.yaml",
            "--show-only",
            "templates/podmonitor.yaml",
            "--show-only",
            "templates/dashboard.yaml",
            "--show-only",
            "templates/prometheusrule.yaml",
        ])
        .unwrap();
    let of_kind = |kind: &str| {
        let document = perago_e2e::yaml_document(&rendered, kind)
            .unwrap_or_else(|| panic!("the chart renders no {kind}:\n{rendered}"));
        serde_json::to_value(document).unwrap()
    };
    let dashboard = of_kind("ConfigMap")["data"]["perago-k8s.json"]
        .as_str()
        .map(|json| serde_json::from_str(json).unwrap())
        .unwrap();
    (
        of_kind("Service"),
        of_kind("ServiceMonitor"),
        of_kind("PodMonitor"),
        dashboard,
        of_kind("PrometheusRule"),
    )
}

#[tokio::test]
async fn prometheus_scrapes_what_the_chart_monitors_and_the_scaler_queries_see_the_task() {
    if perago_e2e::node_opted_out(
        "prometheus_scrapes_what_the_chart_monitors_and_the_scaler_queries_see_the_task",
    ) {
        return;
    }
    let services = shared(Selection::ALL).await;
    let mut turn = Turn::take(
        "monitoring::prometheus_scrapes_what_the_chart_monitors_and_the_scaler_queries_see_the_task",
        services,
    )
    .await;
    turn.release(RELEASE, OPERATOR_NAMESPACE);
    let cluster = Cluster::new(services).unwrap();
    let dir = services.dir().join("monitoring");
    // The collector listens on the node's bridge, which the executor pods reach.
    let collector = Collector::start(&dir, &BRIDGE_IP.to_string())
        .await
        .unwrap();
    let traced = format!("tracing.otlpEndpoint={}", collector.endpoint);
    cluster.install_operator(&["--set", &traced]).unwrap();
    let (service, service_monitor, pod_monitor, dashboard, rules) = chart_monitors(&cluster);
    let client = services.kube().client().await.unwrap();
    let discovery = Discovery::start(&dir.join("targets"), client)
        .await
        .unwrap();
    let mut jobs = service_monitor_jobs(&service_monitor, &discovery);
    // The same scrape without honouring the operator's labels, as the chart had it: the
    // control that shows what `honorLabels` changes.
    let mut unhonoured = jobs[0].clone();
    unhonoured["job_name"] = json!("unhonoured");
    unhonoured["honor_labels"] = json!(false);
    unhonoured["relabel_configs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"replacement": "unhonoured", "target_label": "job"}));
    jobs.push(unhonoured);
    jobs.extend(pod_monitor_jobs(&pod_monitor, &discovery));
    let prometheus = Prometheus::start(&dir, jobs).await.unwrap();

    // `waiting` has no pod, so its work stays queued; `serving` has one.
    cluster.task_namespace(NAMESPACE).unwrap();
    cluster.apply(&task("waiting", 0)).unwrap();
    cluster.apply(&task("serving", 1)).unwrap();
    cluster.wait_ready(NAMESPACE, "waiting").unwrap();
    cluster.wait_ready(NAMESPACE, "serving").unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let mut workflows: Vec<String> = Vec::new();
    for case in ["a", "b"] {
        let id = conductor
            .start(&format!("{NAMESPACE}.waiting"), case, json!({"params": {}}))
            .await;
        workflows.push(id);
    }

    // Both operator replicas are scraped, under the job the Prometheus Operator names after
    // the Service; the leader's series carry the PeragoTask's own namespace.
    let operator_job = service["metadata"]["name"].as_str().unwrap();
    prometheus
        .expect(&format!("count(up{{job=\"{operator_job}\"}} == 1)"), 2.0)
        .await
        .unwrap();

    // The query docs/autoscaling.md gives KEDA's Prometheus trigger, aimed at this task.
    let autoscaling = include_str!("../../../docs/autoscaling.md");
    let keda = &autoscaling[autoscaling.find("## KEDA").unwrap()..];
    let query = keda
        .split("```promql\n")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .unwrap()
        .replace("data-pipelines", NAMESPACE)
        .replace("features-build", "waiting");
    prometheus.expect(&query, 2.0).await.unwrap();

    // Not honoured, the PeragoTask's namespace becomes `exported_namespace` and the scaler
    // queries match nothing.
    prometheus
        .expect(
            &format!(
                "max(perago_operator_task_queued_attempts{{job=\"unhonoured\",exported_namespace=\"{NAMESPACE}\",name=\"waiting\"}})"
            ),
            2.0,
        )
        .await
        .unwrap();
    let unmatched = prometheus
        .query(&format!(
            "perago_operator_task_queued_attempts{{job=\"unhonoured\",namespace=\"{NAMESPACE}\"}}"
        ))
        .await
        .unwrap();
    assert!(unmatched.is_empty(), "{unmatched:?}");

    // The task-not-Ready alert's series: both tasks are Ready.
    prometheus
        .expect(
            &format!("count(perago_operator_task_ready{{namespace=\"{NAMESPACE}\"}} == 1)"),
            2.0,
        )
        .await
        .unwrap();

    // prometheus-adapter's rule (docs/autoscaling.md) with the matchers the HPA example gives.
    let matchers = format!("namespace=\"{NAMESPACE}\",name=\"waiting\"");
    let adapter = format!(
        "max by (namespace, name) (perago_operator_task_queued_attempts{{{matchers}}}) \
         + max by (namespace, name) (perago_operator_task_running_attempts{{{matchers}}})"
    );
    prometheus.expect(&adapter, 2.0).await.unwrap();

    // The executor pod's sidecar (a native sidecar: an init container) is scraped by the
    // PodMonitor's job, with the pod's namespace and name as labels.
    prometheus
        .expect(
            &format!(
                "perago_sidecar_slots{{job=\"{OPERATOR_NAMESPACE}/perago-executors\",namespace=\"{NAMESPACE}\",\
                 pod=~\"serving-perago-.*\",container=\"perago-sidecar\"}}"
            ),
            1.0,
        )
        .await
        .unwrap();
    // Every process says which build it runs: two operator replicas and the executor pod.
    prometheus
        .expect("count(perago_build_info{job!=\"unhonoured\"} == 1)", 3.0)
        .await
        .unwrap();

    // The dashboard after a little work (one attempt published, one failed): every panel's
    // queries return data, so each names series the project exports.
    let mut served = Vec::new();
    for (case, params) in [("ok", json!({})), ("fails", json!({"fail": true}))] {
        let id = conductor
            .start(
                &format!("{NAMESPACE}.serving"),
                case,
                json!({"params": params}),
            )
            .await;
        conductor.finished(&id).await;
        served.push(id);
    }
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$namespace", NAMESPACE)
                .replace("$__rate_interval", "2m");
            let answered = prometheus.answered(&expr).await;
            assert!(
                answered.is_ok(),
                "panel {:?}: {:?}",
                panel["title"],
                answered.err()
            );
            queries += 1;
        }
    }

    // Every alert's expression evaluates on what Prometheus scraped (`promtool test rules`
    // covers when each fires: e2e/tests/alerts.rs).
    let mut alerts = 0;
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            let evaluated = prometheus.query(expr).await;
            assert!(
                evaluated.is_ok(),
                "alert {}: {:?}",
                rule["alert"],
                evaluated.err()
            );
            alerts += 1;
        }
    }

    // One trace per attempt reached the collector from the executor pod, saying how it ended.
    let ids: Vec<&str> = served.iter().map(String::as_str).collect();
    let traces = collector
        .traces_where(
            "perago.workflow.id",
            &ids,
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    let roots: Vec<_> = collector
        .spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == "attempt")
        .collect();
    assert_eq!(roots.len(), 2, "one trace per attempt: {roots:#?}");
    let statuses: Vec<(&str, &str)> = traces
        .iter()
        .map(|t| {
            let root = &t[0];
            assert!(
                root.resource["service.instance.id"]
                    .as_str()
                    .is_some_and(|pod| pod.starts_with("serving-perago-")),
                "{root:#?}"
            );
            (
                root.text("perago.workflow.id").unwrap(),
                root.text("perago.attempt.status").unwrap(),
            )
        })
        .collect();
    assert!(statuses.contains(&(ids[0], "COMPLETED")), "{statuses:?}");
    assert!(statuses.contains(&(ids[1], "FAILED")), "{statuses:?}");

    let targets = prometheus.targets().await.unwrap();
    let down: Vec<&Value> = targets.iter().filter(|t| t["health"] != "up").collect();
    eprintln!(
        "prometheus: {} targets ({} not up); KEDA's query and the adapter's rule gave 2; \
         the dashboard's {queries} queries all returned data; the {alerts} alert expressions \
         evaluated; the collector holds one trace per attempt",
        targets.len(),
        down.len()
    );
    // The HPA example, run: prometheus-adapter serves the rule of docs/autoscaling.md from
    // this Prometheus, and the HPA scales a task whose six attempts (one slot per pod, each
    // running half a minute) need three pods at the example's two per pod.
    let autoscaling = include_str!("../../../docs/autoscaling.md");
    let section = &autoscaling[autoscaling.find("## An HPA on external metrics").unwrap()..];
    let values: Value = serde_yaml::from_str(
        section
            .split("```yaml\n")
            .nth(1)
            .and_then(|block| block.split("```").next())
            .unwrap(),
    )
    .unwrap();
    let adapter = perago_e2e::adapter::PrometheusAdapter::start(
        &dir,
        &services.kube().kubeconfig,
        &cluster,
        NAMESPACE,
        &prometheus.url,
        &values["rules"]["external"],
    )
    .await
    .unwrap();
    cluster
        .apply(&task_with_body(
            "busy",
            1,
            "sleep 30; echo '{}' > \"$PERAGO_RESULT\"",
        ))
        .unwrap();
    cluster.wait_ready(NAMESPACE, "busy").unwrap();
    let example = include_str!("../../../deploy/examples/scalers/hpa-external-metrics.yaml");
    let mut hpa: Value = serde_yaml::from_str(example).unwrap();
    hpa["metadata"]["namespace"] = json!(NAMESPACE);
    hpa["spec"]["scaleTargetRef"]["name"] = json!("busy");
    hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["name"] =
        json!("busy");
    cluster.apply(&hpa.to_string()).unwrap();
    for case in 0..6 {
        let id = conductor
            .start(
                &format!("{NAMESPACE}.busy"),
                &format!("busy-{case}"),
                json!({"params": {}}),
            )
            .await;
        workflows.push(id);
    }
    let client = services.kube().client().await.unwrap();
    let tasks: kube::Api<perago_api::PeragoTask> = kube::Api::namespaced(client, NAMESPACE);
    let started = std::time::Instant::now();
    let (mut replicas, mut ready) = (0, 0);
    while started.elapsed() < std::time::Duration::from_secs(180) {
        let task = tasks.get("busy").await.unwrap();
        replicas = task.spec.executor.replicas;
        ready = task.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if replicas == 3 && ready == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let hpa_status = cluster
        .kubectl(&[
            "get",
            "hpa",
            "-n",
            NAMESPACE,
            "features-build",
            "-o",
            "json",
        ])
        .unwrap();
    assert!(
        replicas == 3 && ready == 3,
        "the HPA did not scale the task to 3 (replicas {replicas}, ready {ready}):\n{hpa_status}"
    );
    let hpa_status: Value = serde_json::from_str(&hpa_status).unwrap();
    let metric = &hpa_status["status"]["currentMetrics"][0]["external"];
    assert_eq!(metric["metric"]["name"], "perago_task_work", "{hpa_status}");
    eprintln!(
        "HPA on perago_task_work (via prometheus-adapter): the task at 3 pods, all ready, {:.1?} \
         after 6 attempts were queued; the HPA saw {}",
        started.elapsed(),
        metric["current"]
    );
    cluster
        .kubectl(&["delete", "hpa", "-n", NAMESPACE, "features-build"])
        .unwrap();

    // The pods may have run some of them meanwhile.
    for id in workflows {
        conductor.terminate(&id).await;
    }

    // Leave the cluster as found: the external metrics API unregistered (the adapter's stop;
    // an APIService nobody serves would keep namespaces from being deleted), the tasks gone
    // while their operator runs (finalizers), then the release.
    drop(adapter);
    delete_tasks(&cluster, NAMESPACE);
    uninstall(&cluster, RELEASE, OPERATOR_NAMESPACE);
}
