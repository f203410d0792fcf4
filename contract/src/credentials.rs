//! The Orkes-style Conductor application key both binaries send for a token. Conductor OSS has
//! no authentication and needs none.

/// `CONDUCTOR_AUTH_KEY` / `CONDUCTOR_AUTH_SECRET`; the secret never shows in `Debug` output.
#[derive(Clone)]
pub struct ConductorCredentials {
    pub key: String,
    pub secret: String,
}

impl std::fmt::Debug for ConductorCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConductorCredentials")
            .field("key", &self.key)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_redacted() {
        let c = ConductorCredentials {
            key: "k".into(),
            secret: "canary-secret".into(),
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("\"k\"") && !shown.contains("canary-secret"),
            "{shown}"
        );
    }
}
