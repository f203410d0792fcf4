//! The webhook's serving certificate, kept in a Secret of the operator's namespace so that
//! every replica serves the same one.
//!
//! Managed (the default): the first replica to start makes a certificate authority and a
//! serving certificate for the webhook Service and stores both in the Secret; a replica that
//! finds the certificate within 30 days of expiry renews it with the same authority, so the
//! `caBundle` never changes under a running apiserver; every replica writes the authority into
//! the ValidatingWebhookConfiguration (idempotent, so replicas never fight). Not managed
//! (cert-manager): the Secret and the `caBundle` are cert-manager's, and replicas only read.
//! Either way each replica reloads the Secret every minute.

use std::collections::BTreeMap;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Annotation holding the serving certificate's expiry (Unix seconds) in a managed Secret.
const NOT_AFTER: &str = "perago.io/not-after";
const CA_NAME: &str = "perago-operator-webhook-ca";
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
const VALID_FOR_DAYS: i64 = 365;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the webhook Secret {0}: {1}")]
    Kube(String, #[source] kube::Error),
    #[error("the webhook Secret {0} has no {1}")]
    Missing(String, &'static str),
    #[error("making the webhook certificate failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("loading the webhook certificate failed: {0}")]
    Load(#[from] std::io::Error),
}

/// Where the certificate lives and whom it serves.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub secret: String,
    pub service: String,
    pub configuration: String,
    pub manage: bool,
    /// How often [`keep_fresh`] looks at the certificate.
    pub check_every: Duration,
}

/// A serving certificate and key, and the authority clients trust, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

fn now_seconds() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(10 * 365);
    Ok(params)
}

/// A serving certificate for the webhook Service, signed by the authority with `ca_key`.
fn serving(settings: &Settings, ca_key: &KeyPair) -> Result<(String, String, i64), rcgen::Error> {
    let (svc, ns) = (&settings.service, &settings.namespace);
    let mut params = CertificateParams::new(vec![
        svc.clone(),
        format!("{svc}.{ns}"),
        format!("{svc}.{ns}.svc"),
        format!("{svc}.{ns}.svc.cluster.local"),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{svc}.{ns}.svc"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let not_after = time::OffsetDateTime::now_utc() + time::Duration::days(VALID_FOR_DAYS);
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    // The issuer is rebuilt from the authority's fixed name and its stored key: that is all
    // signing needs, and the authority's key identifier comes from the same key.
    let issuer = Issuer::new(ca_params()?, ca_key);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), not_after.unix_timestamp()))
}

fn field(secret: &Secret, key: &'static str, name: &str) -> Result<String, Error> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Error::Missing(name.to_owned(), key))
}

fn pem_of(secret: &Secret, name: &str) -> Result<Pem, Error> {
    Ok(Pem {
        cert: field(secret, "tls.crt", name)?,
        key: field(secret, "tls.key", name)?,
        ca: field(secret, "ca.crt", name)?,
    })
}

fn secret_of(settings: &Settings, pem: &Pem, ca_key: &str, not_after: i64) -> Secret {
    let data = [
        ("tls.crt", &pem.cert),
        ("tls.key", &pem.key),
        ("ca.crt", &pem.ca),
        ("ca.key", &ca_key.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(settings.secret.clone()),
            namespace: Some(settings.namespace.clone()),
            annotations: Some(BTreeMap::from([(
                NOT_AFTER.to_owned(),
                not_after.to_string(),
            )])),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "perago-operator".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The certificate to serve: read from the Secret, made or renewed first when managed.
pub async fn ensure(client: &kube::Client, settings: &Settings) -> Result<Pem, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let name = format!("{}/{}", settings.namespace, settings.secret);
    let kube_err = |e| Error::Kube(name.clone(), e);
    let existing = secrets.get_opt(&settings.secret).await.map_err(kube_err)?;
    if !settings.manage {
        return match existing {
            Some(secret) => pem_of(&secret, &name),
            None => Err(Error::Missing(name, "data (it does not exist yet)")),
        };
    }
    match existing {
        None => {
            let ca_key = KeyPair::generate()?;
            let ca = ca_params()?.self_signed(&ca_key)?;
            let (cert, key, not_after) = serving(settings, &ca_key)?;
            let pem = Pem {
                cert,
                key,
                ca: ca.pem(),
            };
            let secret = secret_of(settings, &pem, &ca_key.serialize_pem(), not_after);
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => {
                    tracing::info!(secret = %name, "made the webhook's certificate authority and certificate");
                    Ok(pem)
                }
                // Another replica made it first: serve that one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let secret = secrets.get(&settings.secret).await.map_err(kube_err)?;
                    pem_of(&secret, &name)
                }
                Err(e) => Err(kube_err(e)),
            }
        }
        Some(secret) => {
            let pem = pem_of(&secret, &name)?;
            let not_after: i64 = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NOT_AFTER))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let renew_at = not_after - i64::try_from(RENEW_BEFORE.as_secs()).unwrap_or(0);
            if now_seconds() < renew_at {
                return Ok(pem);
            }
            let ca_key_pem = field(&secret, "ca.key", &name)?;
            let ca_key = KeyPair::from_pem(&ca_key_pem)?;
            let (cert, key, not_after) = serving(settings, &ca_key)?;
            let renewed = Pem { cert, key, ..pem };
            let mut next = secret_of(settings, &renewed, &ca_key_pem, not_after);
            // Optimistic concurrency: of replicas renewing at once, one write wins.
            next.metadata.resource_version = secret.metadata.resource_version.clone();
            match secrets
                .replace(&settings.secret, &PostParams::default(), &next)
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, "renewed the webhook certificate");
                    Ok(renewed)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let secret = secrets.get(&settings.secret).await.map_err(kube_err)?;
                    pem_of(&secret, &name)
                }
                Err(e) => Err(kube_err(e)),
            }
        }
    }
}

/// Write `ca` into every webhook of the configuration, when it is not there yet.
pub async fn inject(client: &kube::Client, settings: &Settings, ca: &str) -> Result<(), Error> {
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = format!("ValidatingWebhookConfiguration {}", settings.configuration);
    let Some(mut configuration) = configurations
        .get_opt(&settings.configuration)
        .await
        .map_err(|e| Error::Kube(name.clone(), e))?
    else {
        tracing::warn!(configuration = %settings.configuration, "no ValidatingWebhookConfiguration to give the certificate authority to");
        return Ok(());
    };
    let bundle = ByteString(ca.as_bytes().to_vec());
    let mut changed = false;
    for webhook in configuration.webhooks.iter_mut().flatten() {
        if webhook.client_config.ca_bundle.as_ref() != Some(&bundle) {
            webhook.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if changed {
        configurations
            .replace(
                &settings.configuration,
                &PostParams::default(),
                &configuration,
            )
            .await
            .map_err(|e| Error::Kube(name.clone(), e))?;
        tracing::info!(configuration = %settings.configuration, "wrote the webhook's certificate authority into its configuration");
    }
    Ok(())
}

/// The certificate to start serving with; when managed, its authority is in the configuration.
pub async fn prepare(
    client: &kube::Client,
    settings: &Settings,
) -> Result<(Pem, RustlsConfig), Error> {
    let pem = ensure(client, settings).await?;
    if settings.manage {
        inject(client, settings, &pem.ca).await?;
    }
    let config =
        RustlsConfig::from_pem(pem.cert.as_bytes().to_vec(), pem.key.as_bytes().to_vec()).await?;
    Ok((pem, config))
}

/// Every `settings.check_every` (a minute by default): renew when due, reload what the Secret
/// holds, keep the `caBundle` right.
pub async fn keep_fresh(
    client: kube::Client,
    settings: Settings,
    config: RustlsConfig,
    mut pem: Pem,
) {
    let mut tick = tokio::time::interval(settings.check_every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let next = match ensure(&client, &settings).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "refreshing the webhook certificate failed; serving the current one");
                continue;
            }
        };
        if settings.manage
            && let Err(e) = inject(&client, &settings, &next.ca).await
        {
            tracing::warn!(error = %e, "writing the webhook's certificate authority failed");
        }
        if next != pem {
            match config
                .reload_from_pem(next.cert.as_bytes().to_vec(), next.key.as_bytes().to_vec())
                .await
            {
                Ok(()) => {
                    tracing::info!("serving the webhook's new certificate");
                    pem = next;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "loading the webhook's new certificate failed")
                }
            }
        }
    }
}
