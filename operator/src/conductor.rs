//! The operator's Conductors: one [`ConductorClient`] (and so one Orkes token) per Conductor
//! base URL a PeragoTask names, sharing one connection pool; every call is counted in
//! `perago_operator_conductor_calls_total{call, outcome}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use perago_conductor::{ConductorClient, ConductorError, Credentials};
use serde_json::Value;

pub struct Conductors {
    http: reqwest::Client,
    timeout: Duration,
    credentials: Option<Credentials>,
    observer: Option<perago_conductor::CallObserver>,
    clients: Mutex<HashMap<String, Arc<ConductorClient>>>,
}

impl Conductors {
    pub fn new(
        timeout: Duration,
        calls: Option<prometheus::IntCounterVec>,
        credentials: Option<Credentials>,
    ) -> Result<Self, reqwest::Error> {
        let observer = calls.map(|calls| -> perago_conductor::CallObserver {
            Arc::new(move |call, outcome| {
                calls.with_label_values(&[call, outcome.as_str()]).inc();
            })
        });
        Ok(Self {
            http: perago_conductor::http_client(timeout)?,
            timeout,
            credentials,
            observer,
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// The client of the Conductor whose API is at `base` (made on first use).
    pub fn at(&self, base: &str) -> Arc<ConductorClient> {
        let base = base.trim_end_matches('/');
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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
