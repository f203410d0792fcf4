//! What this replica knows of its own Lease, beside what the lease library reports.
//!
//! The library tells a holder that it lost the Lease only once it reads the Lease again. While
//! the API server cannot be reached it reports nothing, so a holder cut off from the API
//! server would go on reconciling after its Lease expired, and another replica may take the
//! Lease as soon as the API server is back. As client-go's elector does, a holder here stops
//! when its Lease expires by the last renewal it saw, reachable or not (ADR 0026).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;

/// The Lease's name.
pub const LEASE: &str = "perago-operator";

/// How often the Lease is read while leading or waiting to.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Until when the Lease is `identity`'s: its renewal plus its duration, or `None` when
/// another replica holds it or it says nothing of either.
pub fn held_until(lease: &Lease, identity: &str) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let seconds = i64::from(spec.lease_duration_seconds?);
    renewed.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// Until the Lease, as read now, is `identity`'s and not expired.
pub async fn confirmed(leases: &Api<Lease>, identity: &str) {
    loop {
        if let Ok(Some(lease)) = leases.get_opt(LEASE).await
            && held_until(&lease, identity).is_some_and(|until| until > Timestamp::now())
        {
            return;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Resolves when `identity`'s Lease has expired by the last renewal seen, or another replica
/// holds it. Reads that fail (the API server away) change nothing: the last renewal seen
/// still decides.
pub async fn lapsed(leases: &Api<Lease>, identity: &str) {
    let mut until = Timestamp::now()
        .checked_add(SignedDuration::from_secs(1))
        .ok();
    loop {
        match leases.get_opt(LEASE).await {
            Ok(Some(lease)) => match held_until(&lease, identity) {
                Some(seen) => until = Some(seen),
                None => return,
            },
            Ok(None) => return,
            Err(_) => {}
        }
        if until.is_none_or(|until| until <= Timestamp::now()) {
            return;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lease(holder: &str, renewed: Timestamp, seconds: i32) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": holder,
                "renewTime": renewed.to_string(),
                "leaseDurationSeconds": seconds,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_lease_is_held_until_its_renewal_plus_its_duration_and_only_by_its_holder() {
        let renewed: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        let held = lease("replica-a", renewed, 15);
        assert_eq!(
            held_until(&held, "replica-a"),
            Some("2026-12-04T10:00:15Z".parse().unwrap())
        );
        assert_eq!(held_until(&held, "replica-b"), None);
        let empty: Lease = serde_json::from_value(serde_json::json!({"metadata": {}})).unwrap();
        assert_eq!(held_until(&empty, "replica-a"), None);
    }
}
