//! Steps published by real executor pods: a workspace step, a pod template's placement and
//! volumes, a compiled body without a shell, an ephemeral work volume, a Python Perago module.

use super::*;

#[tokio::test]
async fn a_workspace_step_is_published_by_a_real_executor_pod() {
    let Some((_turn, services, cluster)) =
        cluster("a_workspace_step_is_published_by_a_real_executor_pod").await
    else {
        return;
    };
    let (namespace, name) = ("pods-publish", "publish");
    cluster.task_namespace(namespace).unwrap();
    let applied = std::time::Instant::now();
    cluster
        .apply(&workspace_task(namespace, name, PUBLISH_BODY))
        .unwrap();
    let ready = cluster.wait_ready(namespace, name);
    let took = applied.elapsed();
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    if let Err(e) = ready {
        let describe = cluster
            .kubectl(&["describe", "pod", "-n", namespace, &pod_name])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }

    let lake = Lake::of(services.lakefs());
    let repository = format!("pods-publish-{}", std::process::id());
    let input_ref = lake
        .seed(
            &repository,
            &[("data/in.txt", "seed"), ("other/keep.txt", "x")],
        )
        .await
        .unwrap();
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let started = std::time::Instant::now();
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "real-pod",
        &repository,
        &input_ref,
        3,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    eprintln!(
        "PeragoTask applied → Ready (TaskDef, Deployment, pod scheduled, runner installed, \
         sidecar started) in {took:.1?}; workflow started → finished in {:.1?}",
        started.elapsed()
    );
    let step = &finished["tasks"][0];
    let logs = |container: &str| {
        cluster
            .kubectl(&["logs", "-n", namespace, &pod_name, "-c", container])
            .unwrap_or_else(|e| format!("{e:#}"))
    };
    assert_eq!(
        step["status"],
        "COMPLETED",
        "{step}\nsidecar:\n{}\nbody:\n{}",
        logs("perago-sidecar"),
        logs("body")
    );
    assert_eq!(step["outputData"]["result"], json!({"files": 3}));
    assert!(
        step["workerId"].as_str().unwrap().contains(&pod_name),
        "the worker id names the pod: {}",
        step["workerId"]
    );

    // The squash commit on main, with the audit metadata, holding exactly the workspace.
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    let commit = lake
        .get(&format!("/repositories/{repository}/commits/{head}"))
        .await
        .unwrap();
    assert_eq!(commit["parents"], json!([input_ref]));
    let metadata = &commit["metadata"];
    assert_eq!(metadata["perago.workflow_instance_id"], workflow.as_str());
    assert_eq!(metadata["perago.task_id"], step["taskId"]);
    assert_eq!(metadata["perago.retry_count"], "0");
    let tree = lake.tree(&repository, head).await.unwrap();
    let keys: Vec<&str> = tree.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "data/in.txt",
            "data/out/part-0.txt",
            "data/out/part-1.txt",
            "data/out/part-2.txt",
            "other/keep.txt"
        ]
    );
    assert_eq!(
        lake.object(&repository, head, "data/out/part-2.txt")
            .await
            .unwrap(),
        "row 2 of seed\n"
    );
    let branches = lake
        .get(&format!("/repositories/{repository}/branches"))
        .await
        .unwrap();
    assert_eq!(
        branches["results"].as_array().unwrap().len(),
        1,
        "only main is left: {branches}"
    );

    // The pod as the kubelet ran it: the native sidecar started before the body, the body
    // holds no Conductor or lakeFS credential, and the logs name the attempt.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(&pod_name).await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let status = pod.status.as_ref().unwrap();
    let started_at = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                      container: &str| {
        statuses
            .iter()
            .flatten()
            .find(|s| s.name == container)
            .and_then(|s| s.state.as_ref()?.running.as_ref()?.started_at.clone())
            .unwrap_or_else(|| panic!("{container} is not running: {status:?}"))
    };
    let sidecar_started = started_at(&status.init_container_statuses, "perago-sidecar");
    let body_started = started_at(&status.container_statuses, "body");
    assert!(
        sidecar_started.0 <= body_started.0,
        "sidecar started {sidecar_started:?}, body {body_started:?}"
    );
    // The sidecar installed the runner the body runs: it is the pod's only init container,
    // and the body's attempt above ran through that runner.
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["perago-sidecar"]);
    let body = spec.containers.iter().find(|c| c.name == "body").unwrap();
    for var in body.env.iter().flatten() {
        assert!(
            !var.name.starts_with("CONDUCTOR") && !var.name.starts_with("LAKECTL"),
            "the body sees {}",
            var.name
        );
        assert!(
            var.value_from
                .as_ref()
                .is_none_or(|v| v.secret_key_ref.is_none()),
            "the body reads a Secret through {}",
            var.name
        );
    }
    assert!(body.env_from.is_none(), "the body imports an environment");
    let mounts: Vec<&str> = body
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(
        mounts,
        ["/perago-work", "/tmp"],
        "the body mounts the work volume and /tmp only (no service-account token)"
    );
    let body_env = cluster
        .kubectl(&[
            "exec", "-n", namespace, &pod_name, "-c", "body", "--", "env",
        ])
        .unwrap();
    for secret in ["CONDUCTOR", "LAKECTL", "LAKEFS", "KUBERNETES_TOKEN"] {
        assert!(
            !body_env.contains(secret),
            "the body's process environment holds {secret}:\n{body_env}"
        );
    }
    let sidecar_log = logs("perago-sidecar");
    assert!(
        sidecar_log.contains(&workflow) && sidecar_log.contains(step["taskId"].as_str().unwrap()),
        "the sidecar's log names the attempt:\n{sidecar_log}"
    );
    let body_log = logs("body");
    assert!(
        body_log.contains("body: params") && body_log.contains(&workflow),
        "the body's output and the attempt's identity reach kubectl logs:\n{body_log}"
    );

    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &format!("involvedObject.name={pod_name}"),
            "-o",
            "custom-columns=REASON:.reason,MESSAGE:.message",
        ])
        .unwrap();
    for reason in ["Scheduled", "Started"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    // Both namespaces enforce Pod Security `restricted`, which admitted the operator's and the
    // executor's pods: a pod that breaks it is refused there.
    for ns in [namespace, perago_e2e::cluster::OPERATOR_NAMESPACE] {
        let refused = cluster.kubectl(&[
            "run",
            "privileged",
            "-n",
            ns,
            "--image",
            BUSYBOX_BODY_IMAGE,
            "--privileged",
            "--restart=Never",
        ]);
        let error = format!("{:#}", refused.unwrap_err());
        assert!(
            error.contains("violates PodSecurity \"restricted:latest\""),
            "{ns}: {error}"
        );
    }
    // RBAC's refusal names the operator's ServiceAccount; other tests here have admission
    // policies and Pod Security refuse objects on purpose, and the operator logs those.
    let operator_logs = cluster.operator_logs().unwrap();
    assert!(
        !operator_logs.contains("forbidden: User \"system:serviceaccount:"),
        "the operator was refused by RBAC:\n{operator_logs}"
    );
}

/// Poll `kubectl logs` of a container until it holds `needle`.
/// A platform team's pod template on the real node: node affinity to a label the node carries,
/// a PriorityClass, a pod annotation, a ConfigMap the body reads and publishes, and an
/// in-memory work volume. A template that takes the operator's work volume is refused at
/// `kubectl apply` naming the field.
#[tokio::test]
async fn a_pod_template_places_the_pod_and_gives_the_body_its_volumes() {
    let Some((_turn, services, cluster)) =
        cluster("a_pod_template_places_the_pod_and_gives_the_body_its_volumes").await
    else {
        return;
    };
    let (namespace, name) = ("pods-template", "template");
    cluster.task_namespace(namespace).unwrap();
    cluster
        .kubectl(&[
            "label",
            "node",
            perago_e2e::node::NODE_NAME,
            "perago-e2e/pool=reference",
            "--overwrite",
        ])
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "perago-e2e-batch"}, "value": 1000,
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "reference-data", "namespace": namespace},
                "data": {"lookup.txt": "from the reference ConfigMap\n"},
            })
            .to_string(),
        )
        .unwrap();
    let template = json!({"executor": {
        "workVolume": {"emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        "podTemplate": {
            "metadata": {"annotations": {"example.com/cost-center": "4711"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "perago-e2e/pool", "operator": "In", "values": ["reference"]}]}]}}},
            "priorityClassName": "perago-e2e-batch",
            "volumes": [{"name": "reference", "configMap": {"name": "reference-data"}}],
            "volumeMounts": [{"name": "reference", "mountPath": "/reference", "readOnly": true}],
        },
    }});
    let body = r#"
set -eu
cp /reference/lookup.txt "$PERAGO_WORKSPACE/lookup.txt"
printf '{"files": 1}' > "$PERAGO_RESULT"
"#;
    cluster
        .apply(&workspace_task_with(namespace, name, body, &template))
        .unwrap();
    let ready = cluster.wait_ready(namespace, name);
    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    if let Err(e) = ready {
        let describe = cluster
            .kubectl(&["describe", "pod", "-n", namespace, &pod_name])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(&pod_name).await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        (spec.priority_class_name.as_deref(), spec.priority),
        (Some("perago-e2e-batch"), Some(1000)),
        "the API server resolved the PriorityClass"
    );
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["example.com/cost-center"],
        "4711"
    );
    assert_eq!(
        spec.node_name.as_deref(),
        Some(perago_e2e::node::NODE_NAME),
        "scheduled onto the labelled node"
    );
    let work = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "perago-work")
        .unwrap();
    assert_eq!(
        work.empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );

    let (lake, repository, input_ref) = seeded(services, "pods-template").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "template",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/lookup.txt")
            .await
            .unwrap(),
        "from the reference ConfigMap\n",
        "the body read the template's volume and published what it found"
    );

    // A template that takes the operator's work volume never reaches the cluster.
    let clash = json!({"executor": {"podTemplate": {
        "volumes": [{"name": "perago-work", "emptyDir": {}}],
    }}});
    let refused = cluster
        .apply(&workspace_task_with(namespace, "clash", body, &clash))
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains(
            "spec.executor.podTemplate.volumes[0].name: perago-work is the operator's volume"
        ),
        "{refused:#}"
    );
    let _ = cluster.kubectl(&["delete", "priorityclass", "perago-e2e-batch"]);
}

/// A body image with no shell and nothing of ours: a static program in a compiled language.
/// The init container's static runner starts it, and its workspace is published.
#[tokio::test]
async fn a_compiled_body_in_an_image_without_a_shell_is_published() {
    let Some((_turn, services, cluster)) =
        cluster("a_compiled_body_in_an_image_without_a_shell_is_published").await
    else {
        return;
    };
    let (namespace, name) = ("pods-compiled", "compiled");
    cluster.task_namespace(namespace).unwrap();
    let mut task: serde_json::Value =
        serde_json::from_str(&workspace_task_with(namespace, name, "", &json!({}))).unwrap();
    task["spec"]["resultSchema"] = json!({
        "type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"],
    });
    task["spec"]["executor"]["body"] = json!({
        "image": perago_e2e::node::COMPILED_BODY_IMAGE,
        "command": ["/usr/local/bin/perago-body-compiled"],
    });
    cluster.apply(&task.to_string()).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let (lake, repository, input_ref) = seeded(services, "pods-compiled").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "compiled",
        &repository,
        &input_ref,
        1,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    assert_eq!(
        step["outputData"]["result"],
        json!({"greeting": "hello from a compiled body"})
    );
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/compiled/hello.txt")
            .await
            .unwrap(),
        "hello\n"
    );
}

/// A generic ephemeral work volume from a storage class: the pod's PersistentVolumeClaim is
/// bound to a local PersistentVolume the test provides (a class without a provisioner, bound
/// when the pod is scheduled), the workspace step runs and publishes through it, and the
/// claim goes away with the pod.
#[tokio::test]
async fn an_ephemeral_work_volume_from_a_storage_class_carries_the_workspace() {
    let Some((_turn, services, cluster)) =
        cluster("an_ephemeral_work_volume_from_a_storage_class_carries_the_workspace").await
    else {
        return;
    };
    let (namespace, name) = ("pods-ephemeral", "claimed");
    cluster.task_namespace(namespace).unwrap();
    // The volume's directory on the node, writable by the pod's non-root users as an
    // emptyDir is.
    let disk = tempfile::Builder::new()
        .prefix("perago-local-pv-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        disk.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let (class, volume) = (
        "perago-e2e-local",
        format!("perago-e2e-work-{}", std::process::id()),
    );
    cluster
        .apply(&format!(
            r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {volume}}}
spec:
  capacity: {{storage: 2Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {class}
  local: {{path: {path}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]
"#,
            path = disk.path().display(),
            node = perago_e2e::node::NODE_NAME,
        ))
        .unwrap();
    let spec = json!({"executor": {"workVolume": {"ephemeral": {"storageClassName": class, "size": "1Gi"}}}});
    cluster
        .apply(&workspace_task_with(namespace, name, PUBLISH_BODY, &spec))
        .unwrap();
    cluster.wait_ready(namespace, name).unwrap();

    let client = services.kube().client().await.unwrap();
    let pod = task_pod(&client, namespace, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    let claim = claims
        .get(&format!("{pod_name}-{}", perago_api::pod::WORK_VOLUME))
        .await
        .unwrap();
    assert_eq!(
        claim.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(volume.as_str()),
        "the pod's claim is bound to the test's volume"
    );
    assert!(
        disk.path().join("bin/perago-runner").exists(),
        "the init container installed the runner on the claimed volume"
    );

    let (lake, repository, input_ref) = seeded(services, "pods-ephemeral").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let workflow = start_step(
        &conductor,
        namespace,
        name,
        "ephemeral",
        &repository,
        &input_ref,
        2,
    )
    .await;
    let finished = conductor.finished(&workflow).await;
    let step = &finished["tasks"][0];
    assert_eq!(step["status"], "COMPLETED", "{step}");
    let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
    assert_eq!(
        lake.object(&repository, head, "data/out/part-1.txt")
            .await
            .unwrap(),
        "row 1 of seed\n"
    );

    // The claim is the pod's: deleting the task deletes the pod, and the claim with it.
    cluster
        .kubectl(&["delete", "peragotask", "-n", namespace, name, "--wait"])
        .unwrap();
    wait_gone(
        &Api::namespaced(client.clone(), namespace),
        &pod_name,
        Duration::from_secs(120),
    )
    .await;
    let mut claim_left = true;
    for _ in 0..300 {
        claim_left = !claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty();
        if !claim_left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!claim_left, "the pod's claim outlived it");
    let _ = cluster.kubectl(&["delete", "persistentvolume", &volume, "--wait=false"]);
    let _ = cluster.kubectl(&["delete", "storageclass", class]);
}

/// A Python Perago task module, unchanged, as a user moves it: `perago-k8s manifest` writes its
/// PeragoTask; the body image holds Python, Python Perago and perago-k8s; the module reaches
/// the body from a ConfigMap. Python Perago's own worker runs it first, for comparison.
const PYTHON_MODULE: &str = r#"
import os
from pathlib import Path

from pydantic import BaseModel

from perago import WorkspaceSpec, task


class Params(BaseModel):
    n: int


class Result(BaseModel):
    files: int
    pid: int


@task(name="pods-python.split", owner_email="e2e@example.com", description="", workspace=WorkspaceSpec(prefix="/data"))
def split(workspace: Path, params: Params) -> Result:
    source = (workspace / "in.txt").read_text()
    out = workspace / "out"
    out.mkdir(exist_ok=True)
    for i in range(params.n):
        (out / f"part-{i}.txt").write_text(f"row {i} of {source}\n")
    return Result(files=params.n, pid=os.getpid())
"#;

#[tokio::test]
async fn a_python_perago_module_runs_unchanged_in_a_persistent_body_on_the_node() {
    let Some((_turn, services, cluster)) =
        cluster("a_python_perago_module_runs_unchanged_in_a_persistent_body_on_the_node").await
    else {
        return;
    };
    let (namespace, name) = ("pods-python", "split");
    let image = super::python_body_image(services).await;

    let modules = tempfile::tempdir().unwrap();
    std::fs::write(modules.path().join("splitter.py"), PYTHON_MODULE).unwrap();
    let spec = perago_e2e::python::manifest(modules.path(), "splitter");
    assert_eq!(spec.task_name, format!("{namespace}.{name}"));

    // First Python Perago's own worker on this host, against the same Conductor and lakeFS
    // (`perago start` needs the TaskDef registered; the operator's is the same, byte for byte).
    let conductor = ConductorApi::new(&services.conductor().api_url);
    conductor
        .call(
            reqwest::Method::POST,
            "/metadata/taskdefs",
            Some(&json!([perago_api::taskdef::render(&spec).unwrap()])),
        )
        .await;
    let (lake, python_repository, python_input) = seeded(services, "pods-python-worker").await;
    let by_python = {
        let worker = perago_e2e::python::Worker::start(
            services,
            "splitter",
            PYTHON_MODULE,
            &services.conductor().api_url,
            &[],
        )
        .unwrap();
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            "python-worker",
            &python_repository,
            &python_input,
            2,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = finished["tasks"][0].clone();
        assert_eq!(step["status"], "COMPLETED", "{step}\n{}", worker.log());
        step
        // The worker stops here, before the PeragoTask's pod polls the same task type.
    };

    let mut spec = serde_json::to_value(&spec).unwrap();
    merge(
        &mut spec,
        &json!({"executor": {
            "slots": 1,
            "body": {
                "image": image,
                "mode": "persistent",
                "env": [{"name": "PYTHONPATH", "value": "/modules"}],
            },
            "podTemplate": {
                "volumes": [{"name": "modules", "configMap": {"name": "python-modules"}}],
                "volumeMounts": [{"name": "modules", "mountPath": "/modules", "readOnly": true}],
            },
        }}),
    );
    cluster.task_namespace(namespace).unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "python-modules", "namespace": namespace},
                "data": {"splitter.py": PYTHON_MODULE},
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "perago.io/v1alpha1", "kind": "PeragoTask",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            })
            .to_string(),
        )
        .unwrap();
    let client = services.kube().client().await.unwrap();
    if let Err(e) = cluster.wait_ready(namespace, name) {
        let pod = task_pod(&client, namespace, name).await;
        let describe = cluster
            .kubectl(&[
                "describe",
                "pod",
                "-n",
                namespace,
                &pod.metadata.name.unwrap(),
            ])
            .unwrap_or_default();
        panic!("{e:#}\n{describe}");
    }

    let (_, repository, input_ref) = seeded(services, "pods-python").await;
    let mut steps = Vec::new();
    // The second run starts from the first one's commit: its step fences on the branch's head.
    let mut input_ref = input_ref;
    for n in [2, 3] {
        let workflow = start_step(
            &conductor,
            namespace,
            name,
            &format!("python-{n}"),
            &repository,
            &input_ref,
            n,
        )
        .await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        if step["status"] != "COMPLETED" {
            let pod = task_pod(&client, namespace, name)
                .await
                .metadata
                .name
                .unwrap();
            let logs = cluster
                .kubectl(&["logs", "-n", namespace, &pod, "--all-containers"])
                .unwrap_or_else(|e| format!("{e:#}"));
            panic!("{step}\n{logs}");
        }
        let result = &step["outputData"]["result"];
        assert_eq!(result["files"], n, "{step}");
        let head = step["outputData"]["workspace"]["ref"].as_str().unwrap();
        for i in 0..n {
            assert_eq!(
                lake.object(&repository, head, &format!("data/out/part-{i}.txt"))
                    .await
                    .unwrap(),
                format!("row {i} of seed\n")
            );
        }
        assert!(
            lake.object(&repository, head, &format!("data/out/part-{n}.txt"))
                .await
                .is_err(),
            "no part beyond the runs' n"
        );
        input_ref = head.to_owned();
        steps.push(step.clone());
    }
    // The same module from the same input: the same result and the same files on the branch
    // as Python Perago's worker made.
    let result =
        |step: &serde_json::Value, field: &str| step["outputData"]["result"][field].clone();
    let head = |step: &serde_json::Value| {
        step["outputData"]["workspace"]["ref"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        result(&steps[0], "files"),
        result(&by_python, "files"),
        "{by_python}"
    );
    let (python_head, k8s_head) = (head(&by_python), head(&steps[0]));
    let python_tree = lake.tree(&python_repository, &python_head).await.unwrap();
    assert_eq!(
        python_tree,
        lake.tree(&repository, &k8s_head).await.unwrap(),
        "the branches after Python Perago's worker and after the PeragoTask"
    );
    for key in python_tree.keys() {
        assert_eq!(
            lake.object(&python_repository, &python_head, key)
                .await
                .unwrap(),
            lake.object(&repository, &k8s_head, key).await.unwrap(),
            "{key}"
        );
    }
    assert!(result(&steps[0], "pid").is_i64(), "{}", steps[0]);
    assert_eq!(
        result(&steps[0], "pid"),
        result(&steps[1], "pid"),
        "one slot's persistent body ran both attempts"
    );
}
