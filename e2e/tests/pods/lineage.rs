//! Each publication names the code that produced it (ADR 0042): the body image digest the
//! kubelet reports for the pod that ran the attempt, the PeragoTask and its generation, the
//! contract and the sidecar; and after the task's image tag is moved to a new digest and the
//! pods roll, the next publication names the new digest.

use std::process::Command;
use std::time::Instant;

use super::*;

fn crane(args: &[&str]) -> String {
    perago_e2e::registry::crane(args).unwrap()
}

/// The running pod of task `name` that is not going, once its body container has an image id
/// and the operator has copied it into the pod's annotation: the pod and that id.
async fn annotated_pod(pods: &Api<Pod>, name: &str, not: Option<&str>) -> (Pod, String) {
    let selector = format!("perago.io/task={name}");
    let started = Instant::now();
    loop {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        let found = list.items.into_iter().find_map(|pod| {
            let fresh =
                pod.metadata.deletion_timestamp.is_none() && pod.metadata.name.as_deref() != not;
            let id = body_image_id(&pod)?;
            let annotated = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("perago.io/body-image-id"))
                == Some(&id);
            (fresh && annotated).then_some((pod, id))
        });
        if let Some(found) = found {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "no running pod of {name} with its body image id annotated after 180 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The body container's `imageID` as the kubelet reports it, once it does.
fn body_image_id(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let body = statuses.iter().find(|c| c.name == "body")?;
    Some(body.image_id.clone()).filter(|id| !id.is_empty())
}

/// Run one-step workflows on the head of main until a publication names an image id (the
/// kubelet refreshes the sidecar's copy of the annotations a little after the operator writes
/// them; until then publications say pending); that publication's metadata, and how many
/// publications said pending before it.
async fn publication_with_image_id(
    conductor: &ConductorApi,
    lake: &Lake,
    (namespace, name): (&str, &str),
    repository: &str,
) -> (serde_json::Value, usize) {
    let started = Instant::now();
    let mut pending = 0;
    loop {
        let head = lake
            .get(&format!("/repositories/{repository}/branches/main"))
            .await
            .unwrap()["commit_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let workflow =
            start_step(conductor, namespace, name, "lineage", repository, &head, 1).await;
        let finished = conductor.finished(&workflow).await;
        let step = &finished["tasks"][0];
        assert_eq!(step["status"], "COMPLETED", "{step}");
        let published = step["outputData"]["workspace"]["ref"].as_str().unwrap();
        let commit = lake
            .get(&format!("/repositories/{repository}/commits/{published}"))
            .await
            .unwrap();
        let metadata = commit["metadata"].clone();
        if metadata["perago.body_image_id"] != "" {
            return (metadata, pending);
        }
        pending += 1;
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "{pending} publications in 150 s and every one says the image id is pending: {metadata}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn a_publication_names_the_image_digest_its_pod_ran_even_after_the_tag_moves() {
    let Some((_turn, services, cluster)) =
        cluster("a_publication_names_the_image_digest_its_pod_ran_even_after_the_tag_moves").await
    else {
        return;
    };
    let (namespace, name) = ("pods-lineage", "lineage");
    // The body image, pushed to the node's registry under a tag that is moved below.
    let layout = tempfile::tempdir().unwrap();
    let archive = services.dir().join("images/body-busybox.tar");
    let untar = Command::new("tar")
        .arg("-C")
        .arg(layout.path())
        .arg("-xf")
        .arg(&archive)
        .status()
        .unwrap();
    assert!(untar.success(), "unpacking {}", archive.display());
    let image = format!(
        "{}/perago/e2e-lineage-body:moving",
        services.node().registry.host
    );
    crane(&["push", layout.path().to_str().unwrap(), &image]);
    // An image config of its own: pushed as it is, the image would have the image id of the
    // node's preloaded body image, and once the kubelet had pulled that id, it pulled the
    // preloaded image again for every other test's pod (from `localhost`, which fails).
    crane(&["mutate", &image, "--label", "e2e.perago.io/build=1"]);
    let first_digest = crane(&["digest", &image]).trim().to_owned();

    cluster.task_namespace(namespace).unwrap();
    let script =
        r#"date +%s%N > "$PERAGO_WORKSPACE/run.txt"; printf '{"files": 1}' > "$PERAGO_RESULT""#;
    let task = |roll: &str| {
        workspace_task_with(
            namespace,
            name,
            script,
            &json!({
                "workspace": {"prefix": "/"},
                "executor": {
                    "body": {"image": image, "imagePullPolicy": "Always"},
                    "podTemplate": {"metadata": {"annotations": {"e2e.perago.io/roll": roll}}},
                },
            }),
        )
    };
    cluster.apply(&task("1")).unwrap();
    cluster.wait_ready(namespace, name).unwrap();
    let client = services.kube().client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let tasks: Api<perago_api::PeragoTask> = Api::namespaced(client.clone(), namespace);

    let started = Instant::now();
    let (pod, image_id) = annotated_pod(&pods, name, None).await;
    eprintln!(
        "the operator annotated pod {} with its body image id {image_id} {:.1?} after Ready",
        pod.metadata.name.as_deref().unwrap_or_default(),
        started.elapsed()
    );
    assert!(
        image_id.ends_with(&first_digest),
        "the kubelet's imageID {image_id} names the pushed digest {first_digest}"
    );

    let (lake, repository, _) = seeded(services, "pods-lineage").await;
    let conductor = ConductorApi::new(&services.conductor().api_url);
    let published = Instant::now();
    let (metadata, pending) =
        publication_with_image_id(&conductor, &lake, (namespace, name), &repository).await;
    eprintln!(
        "the image id reached a publication {:.1?} after the annotation ({pending} said pending before)",
        published.elapsed()
    );
    let live = tasks.get(name).await.unwrap();
    let first_generation = live.metadata.generation.unwrap().to_string();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    for (key, value) in [
        ("perago.body_image_id", image_id.as_str()),
        ("perago.body_image", image.as_str()),
        ("perago.peragotask_namespace", namespace),
        ("perago.peragotask_name", name),
        (
            "perago.peragotask_uid",
            live.metadata.uid.as_deref().unwrap(),
        ),
        ("perago.peragotask_generation", first_generation.as_str()),
        (
            "perago.contract_hash",
            annotations["perago.io/contract-hash"].as_str(),
        ),
        ("perago.sidecar_version", env!("CARGO_PKG_VERSION")),
    ] {
        assert_eq!(metadata[key], value, "{key}: {metadata}");
    }

    // The tag moves to a new digest (the same files, another label), and the pods roll.
    crane(&["mutate", &image, "--label", "e2e.perago.io/build=2"]);
    let moved_digest = crane(&["digest", &image]).trim().to_owned();
    assert_ne!(moved_digest, first_digest);
    let old = pod.metadata.name.clone().unwrap();
    cluster.apply(&task("2")).unwrap();
    let (rolled, moved_id) = annotated_pod(&pods, name, Some(&old)).await;
    assert!(
        moved_id.ends_with(&moved_digest),
        "the new pod runs the moved tag's digest: {moved_id}, pushed {moved_digest}"
    );
    wait_gone(&pods, &old, Duration::from_secs(120)).await;
    let (metadata, _) =
        publication_with_image_id(&conductor, &lake, (namespace, name), &repository).await;
    let generation = tasks.get(name).await.unwrap().metadata.generation.unwrap();
    assert_eq!(
        metadata["perago.body_image_id"],
        moved_id.as_str(),
        "the next publication names the new digest ({}): {metadata}",
        rolled.metadata.name.as_deref().unwrap_or_default()
    );
    assert_eq!(
        metadata["perago.peragotask_generation"],
        generation.to_string()
    );
    assert!(
        generation.to_string() != first_generation,
        "the roll is a new generation"
    );
}
