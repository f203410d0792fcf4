//! The offline subcommands: `crd`, `check -f`, `taskdef -f`.
//!
//! Output follows `perago check` / `perago extract`: warnings as `warning: <message>` on
//! standard error, errors as `error: <message>` (printed by `main`) with exit status 1.

use std::io::Read;
use std::path::Path;

use perago_api::manifest::{self, ManifestTask};
use perago_api::{taskdef, validate};

pub fn crd() -> Result<(), String> {
    print!("{}", perago_api::task::crd_yaml());
    Ok(())
}

fn read_manifest(file: &Path) -> Result<Vec<ManifestTask>, String> {
    let text = if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?
    };
    manifest::parse(&text).map_err(|e| e.to_string())
}

/// Validate and print warnings; the error names the task and field.
fn validated(task: &ManifestTask) -> Result<(), String> {
    let warnings = validate(&task.task.spec)
        .map_err(|e| format!("document {} ({}): {e}", task.doc, task.display_name()))?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

pub fn check(file: &Path) -> Result<(), String> {
    let tasks = read_manifest(file)?;
    for task in &tasks {
        validated(task)?;
        // Rendering can only fail on what validation already checked; running it proves it.
        taskdef::render(&task.task.spec).map_err(|e| format!("{}: {e}", task.display_name()))?;
    }
    for task in &tasks {
        println!(
            "ok: {} (task {})",
            task.display_name(),
            task.task.spec.task_name
        );
    }
    Ok(())
}

pub fn taskdef(file: &Path, output: Option<&Path>) -> Result<(), String> {
    let tasks = read_manifest(file)?;
    let [task] = tasks.as_slice() else {
        return Err(format!(
            "the manifest holds {} PeragoTasks; taskdef renders exactly one",
            tasks.len()
        ));
    };
    validated(task)?;
    let doc =
        taskdef::render(&task.task.spec).map_err(|e| format!("{}: {e}", task.display_name()))?;
    match output {
        Some(path) => taskdef::write_file(path, &doc).map_err(|e| e.to_string()),
        None => {
            print!("{}", taskdef::to_file_text(&doc));
            Ok(())
        }
    }
}

/// Print the sidecar's task contract of the one PeragoTask in a manifest (the `contract.json`
/// of its ConfigMap), for running a pod locally with `perago-sidecar local`.
pub fn contract(file: &Path) -> Result<(), String> {
    let tasks = read_manifest(file)?;
    let [task] = tasks.as_slice() else {
        return Err(format!(
            "the manifest holds {} PeragoTasks; contract renders exactly one",
            tasks.len()
        ));
    };
    validated(task)?;
    let contract = perago_api::contract::render(&task.task.spec)
        .map_err(|e| format!("{}: {e}", task.display_name()))?;
    println!("{}", crate::render::contract_text(&contract));
    Ok(())
}

/// Print the ConfigMap, Deployment and (when wanted) NetworkPolicy the operator creates for
/// each PeragoTask, as multi-document YAML (the objects carry owner references to the task;
/// the live operator also sets the replica count from autoscaling when that is enabled).
pub fn render(file: &Path, defaults: &crate::render::Defaults) -> Result<(), String> {
    let tasks = read_manifest(file)?;
    let mut out = String::new();
    for task in &tasks {
        validated(task)?;
        let mut t = task.task.clone();
        if t.metadata.namespace.is_none() {
            t.metadata.namespace = Some("default".into());
        }
        let contract = perago_api::contract::render(&t.spec)
            .map_err(|e| format!("{}: {e}", task.display_name()))?;
        let replicas = t.spec.executor.replicas;
        for doc in [
            serde_yaml::to_string(&crate::render::config_map(&t, &contract)),
            serde_yaml::to_string(&crate::render::deployment(
                &t, &contract, defaults, replicas,
            )),
        ]
        .into_iter()
        .chain(crate::render::network_policy(&t, defaults).map(|p| serde_yaml::to_string(&p)))
        {
            let doc = doc.map_err(|e| format!("{}: {e}", task.display_name()))?;
            out.push_str("---\n");
            out.push_str(&doc);
        }
    }
    print!("{out}");
    Ok(())
}
