//! The operator's Conductors: one [`ConductorClient`] (and so one Orkes token) per Conductor
//! base URL a PeragoTask names, sharing one connection pool; every call is counted in
//! `perago_operator_conductor_calls_total{call, outcome}`; and the TaskDefs of each Conductor,
//! read for all tasks in one listing (ADR 0015).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

pub use perago_conductor::{ConductorClient, ConductorError, Credentials};
use serde_json::Value;

pub struct Conductors {
    http: perago_conductor::trust::TlsClient,
    timeout: Duration,
    credentials: Option<Credentials>,
    observer: Option<perago_conductor::CallObserver>,
    clients: Mutex<HashMap<String, Arc<ConductorClient>>>,
    /// Per base URL: the last listing of its TaskDefs. The async lock is held while a listing
    /// is read, so reconciles that find it stale together wait for one read instead of each
    /// making their own.
    task_defs: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Listing>>>>>,
}

/// Every TaskDef of one Conductor by name, and when they were read. Kept as JSON text, a
/// fraction of the size of parsed values, and parsed for the one task that asks.
struct Listing {
    read: Instant,
    defs: HashMap<String, String>,
}

impl Conductors {
    pub fn new(
        timeout: Duration,
        calls: Option<prometheus::IntCounterVec>,
        credentials: Option<Credentials>,
        tls: perago_conductor::trust::Tls,
    ) -> Result<Self, String> {
        let observer = calls.map(|calls| -> perago_conductor::CallObserver {
            Arc::new(move |call, outcome| {
                calls.with_label_values(&[call, outcome.as_str()]).inc();
            })
        });
        Ok(Self {
            http: perago_conductor::http_client(timeout, tls)?,
            timeout,
            credentials,
            observer,
            clients: Mutex::new(HashMap::new()),
            task_defs: Mutex::new(HashMap::new()),
        })
    }

    /// The client of the Conductor whose API is at `base` (made on first use).
    pub fn at(&self, base: &str) -> Arc<ConductorClient> {
        let base = base.trim_end_matches('/');
        let mut clients = self.clients.lock();
        clients
            .entry(base.to_owned())
            .or_insert_with(|| {
                let client = ConductorClient::with_http(
                    self.http.clone(),
                    base,
                    self.timeout,
                    self.credentials.clone(),
                );
                Arc::new(match &self.observer {
                    Some(observer) => client.observed(observer.clone()),
                    None => client,
                })
            })
            .clone()
    }

    fn listing(&self, base: &str) -> Arc<tokio::sync::Mutex<Option<Listing>>> {
        self.task_defs
            .lock()
            .entry(base.trim_end_matches('/').to_owned())
            .or_default()
            .clone()
    }

    /// The TaskDef `name` as the Conductor at `base` holds it, from a listing of all its
    /// TaskDefs read at most `max_age` ago: one call per Conductor for every task that
    /// reconciles in that time, instead of one per task and reconcile.
    pub async fn task_def(
        &self,
        base: &str,
        name: &str,
        max_age: Duration,
    ) -> Result<Option<Value>, ConductorError> {
        let listing = self.listing(base);
        let mut listing = listing.lock().await;
        let stale = listing.as_ref().is_none_or(|l| l.read.elapsed() > max_age);
        if stale {
            let defs = self.at(base).task_defs().await?;
            *listing = Some(Listing {
                read: Instant::now(),
                defs: defs
                    .into_iter()
                    .map(|(name, def)| (name, def.to_string()))
                    .collect(),
            });
        }
        let def = listing.as_ref().and_then(|l| l.defs.get(name));
        Ok(def.and_then(|text| serde_json::from_str(text).ok()))
    }

    /// What the operator just made TaskDef `name` (`None`: deleted it), so that the next
    /// reconciles do not take the listing's older copy for drift, or for a TaskDef still there.
    pub async fn wrote_task_def(&self, base: &str, name: &str, doc: Option<&Value>) {
        if let Some(listing) = self.listing(base).lock().await.as_mut() {
            match doc {
                Some(doc) => listing.defs.insert(name.to_owned(), doc.to_string()),
                None => listing.defs.remove(name),
            };
        }
    }
}

/// Does `stored` hold every value of `rendered`? Conductor adds fields of its own (times,
/// defaults), so only what the operator renders is compared.
pub fn holds(stored: &Value, rendered: &Value) -> bool {
    match (stored, rendered) {
        (Value::Object(s), Value::Object(r)) => r
            .iter()
            .all(|(k, v)| s.get(k).is_some_and(|sv| holds(sv, v))),
        (Value::Array(s), Value::Array(r)) => {
            s.len() == r.len() && s.iter().zip(r).all(|(a, b)| holds(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drift_ignores_what_conductor_adds_and_sees_what_it_changed() {
        let rendered = json!({"name": "t", "retryCount": 3, "inputSchema": {"data": {"type": "object"}}, "inputKeys": ["params"]});
        let stored = json!({"name": "t", "retryCount": 3, "createTime": 1, "inputSchema": {"createTime": 0, "data": {"type": "object"}}, "inputKeys": ["params"]});
        assert!(holds(&stored, &rendered));
        let edited = json!({"name": "t", "retryCount": 5, "inputSchema": {"data": {"type": "object"}}, "inputKeys": ["params"]});
        assert!(!holds(&edited, &rendered));
        assert!(!holds(&json!({"name": "t"}), &rendered));
    }
}
