//! What the sidecar's suites on lakeFS's PostgreSQL + S3 profile share: the servers, a
//! workspace task registered in Conductor, and the sidecar's lakeFS settings.

#![allow(dead_code, clippy::unwrap_used)]

use perago_e2e::pod::ConductorApi;
use perago_e2e::services::{LAKEFS_ACCESS_KEY_ID, LAKEFS_SECRET_ACCESS_KEY};
use perago_e2e::storage::Storage;
use perago_e2e::{Selection, Services, shared};
use serde_json::Value;

/// Conductor and lakeFS, lakeFS on PostgreSQL with object bytes in an S3 server.
pub async fn services() -> &'static Services {
    shared(Selection {
        conductor: true,
        lakefs: true,
        storage: Storage::PostgresS3,
        ..Selection::default()
    })
    .await
}

/// A workspace task `name` writing under `/data`, retried `retries` times `delay_seconds`
/// apart, with its TaskDef registered; its contract.
pub async fn register_workspace_task(
    api: &ConductorApi,
    name: &str,
    retries: u32,
    delay_seconds: u32,
) -> Value {
    let yaml = format!(
        r#"
apiVersion: perago.io/v1alpha1
kind: PeragoTask
metadata: {{name: t}}
spec:
  taskName: {name}
  ownerEmail: e2e@example.com
  workspace: {{prefix: /data}}
  paramsSchema: {{type: object}}
  resultSchema: {{type: object, properties: {{files: {{type: integer}}}}, required: [files]}}
  controls: {{retry: {{count: {retries}, delaySeconds: {delay_seconds}}}, timeout: {{responseSeconds: 60}}}}
  executor: {{body: {{image: body, command: [sh]}}, slots: 1}}
"#
    );
    api.register_task(&yaml).await
}

/// The sidecar's lakeFS settings for the server at `endpoint`, and `extra`.
pub fn lakefs_env<'a>(endpoint: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("LAKECTL_SERVER_ENDPOINT_URL", endpoint),
        ("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", LAKEFS_ACCESS_KEY_ID),
        (
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
            LAKEFS_SECRET_ACCESS_KEY,
        ),
    ];
    env.extend_from_slice(extra);
    env
}
