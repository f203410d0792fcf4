//! The repository's Python package (`python/`, `perago-k8s`) under the reference Python
//! (Python Perago 0.6.1's interpreter, which has its dependencies).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use perago_api::PeragoTaskSpec;

/// The `python/` directory of the repository.
pub fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python")
}

/// A `PYTHONPATH` holding the package and `modules`.
pub fn path_with(modules: &Path) -> OsString {
    std::env::join_paths([package_dir().as_path(), modules]).expect("paths without ':'")
}

/// The PeragoTask `perago-k8s manifest MODULE --image tasks:1` writes for `module` in
/// `modules`, validated.
pub fn manifest(modules: &Path, module: &str) -> PeragoTaskSpec {
    let python = crate::process::obtain("perago-python").expect("the reference Python");
    let out = std::process::Command::new(python)
        .args(["-m", "perago_k8s", "manifest", module, "--image", "tasks:1"])
        .env("PYTHONPATH", path_with(modules))
        .output()
        .expect("running perago-k8s manifest");
    assert!(
        out.status.success(),
        "perago-k8s manifest {module}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("UTF-8 YAML");
    let spec = perago_api::manifest::parse(&yaml)
        .expect("a PeragoTask")
        .remove(0)
        .task
        .spec;
    perago_api::validate(&spec).expect("a valid PeragoTask");
    spec
}
