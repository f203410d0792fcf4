//! Certificate authorities a client trusts beyond the built-in web roots and the platform's
//! (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS store, which every client reads as well): a
//! company's own CA, given as a PEM bundle file.

use std::path::Path;

/// The certificates of the PEM bundle at `path`, given by the setting `setting` (named in
/// every error, with the path).
pub fn ca_bundle(setting: &str, path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                " (in a pod: is the key in the ConfigMap or Secret that the caBundleRef names?)"
            }
            _ => "",
        };
        format!("{setting}={shown}: cannot read the CA bundle: {e}{hint}")
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{setting}={shown}: not a PEM certificate bundle: {e}"))?;
    if certificates.is_empty() {
        return Err(format!(
            "{setting}={shown}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certificates)
}

/// The certificates of the bundle that the setting `setting` (a `*_CA_FILE` flag or variable)
/// names; none when it is unset or blank.
pub fn roots(setting: &str, path: Option<&Path>) -> Result<Vec<reqwest::Certificate>, String> {
    match path.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => ca_bundle(setting, path),
        None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bundles_name_the_setting_and_the_path() {
        let dir = std::env::temp_dir().join(format!("perago-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = ca_bundle("X_CA_FILE", &dir.join("absent.crt")).unwrap_err();
        assert!(missing.starts_with("X_CA_FILE="), "{missing}");
        assert!(
            missing.contains("is the key in the ConfigMap or Secret"),
            "{missing}"
        );
        let empty = dir.join("empty.crt");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let refused = ca_bundle("X_CA_FILE", &empty).unwrap_err();
        assert!(refused.contains("holds no PEM certificate"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
