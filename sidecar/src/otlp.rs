//! OTLP/HTTP (protobuf) export of the task metrics, as Python Perago 0.6.1 exports them:
//! the application metrics (`app.<name>`) and the runtime metrics (`runtime.<name>`), unit
//! `1`, cumulative temporality, POSTed to `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` as given.
//!
//! The Prometheus registry stays the only store: each export converts what it holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus::proto::{MetricFamily, MetricType};
use prost::Message;
use tracing::{debug, warn};

use perago_contract::setting::{NotReplaced, given};

/// The export settings (the 0.6.1 variables and defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    pub endpoint: String,
    pub gzip: bool,
    pub timeout: Duration,
    pub interval: Duration,
}

/// Variables Perago metrics v1 refuses, checked on every start.
const FORBIDDEN: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// An OpenTelemetry export variable (metrics or traces) the sidecar refuses, naming it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExportSettingError {
    #[error(transparent)]
    NotReplaced(#[from] NotReplaced),
    /// Set, though Perago metrics v1 leaves it to the exporter ([`FORBIDDEN`]).
    #[error("{0} is not supported by Perago metrics v1")]
    Unsupported(&'static str),
    /// A compression other than those `allowed` (in words).
    #[error("{name} must be {allowed}")]
    Compression {
        name: &'static str,
        allowed: &'static str,
    },
    #[error("{0} must be a positive integer number of milliseconds")]
    NotMilliseconds(&'static str),
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error("{0} must be a positive integer")]
    NotPositive(&'static str),
    /// The traces endpoint, which is not an OTLP/HTTP URL.
    #[error(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be an http:// or https:// URL (OTLP/HTTP), not {0:?}"
    )]
    NotHttp(String),
}

/// For start-up code that reports its settings' errors as one line of text.
impl From<ExportSettingError> for String {
    fn from(e: ExportSettingError) -> Self {
        e.to_string()
    }
}

fn millis(name: &'static str, value: Option<&str>) -> Result<Option<Duration>, ExportSettingError> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if !v.chars().all(|c| c.is_ascii_digit()) {
        return Err(ExportSettingError::NotMilliseconds(name));
    }
    match v.parse::<u64>() {
        Ok(0) => Err(ExportSettingError::Zero(name)),
        Ok(ms) => Ok(Some(Duration::from_millis(ms))),
        Err(_) => Err(ExportSettingError::NotMilliseconds(name)),
    }
}

impl OtlpConfig {
    /// Parse in 0.6.1's order; `lookup` reads a variable. `None` when no endpoint is set (the
    /// other settings are then ignored, as in 0.6.1).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ExportSettingError> {
        let given = |name: &str| given(name, lookup(name).as_deref());
        for name in FORBIDDEN {
            if given(name)?.is_some() {
                return Err(ExportSettingError::Unsupported(name));
            }
        }
        let Some(endpoint) = given("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")? else {
            return Ok(None);
        };
        let gzip = match lookup("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION")
            .map(|v| v.trim().to_ascii_lowercase())
        {
            None => false,
            Some(v) if v.is_empty() => false,
            Some(v) if v == "gzip" => true,
            Some(_) => {
                return Err(ExportSettingError::Compression {
                    name: "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
                    allowed: "'gzip'",
                });
            }
        };
        let timeout = millis(
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            lookup("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT").as_deref(),
        )?
        .unwrap_or(Duration::from_secs(10));
        let interval = millis(
            "OTEL_METRIC_EXPORT_INTERVAL",
            lookup("OTEL_METRIC_EXPORT_INTERVAL").as_deref(),
        )?
        .unwrap_or(Duration::from_secs(60));
        Ok(Some(Self {
            endpoint,
            gzip,
            timeout,
            interval,
        }))
    }
}

pub(crate) fn nanos(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
    }
}

/// Convert gathered families, each with its OTel name, into one export request.
pub fn request(
    families: &[(String, MetricFamily)],
    instance_id: &str,
    start: SystemTime,
    now: SystemTime,
) -> ExportMetricsServiceRequest {
    let (start, now) = (nanos(start), nanos(now));
    let metrics = families
        .iter()
        .filter_map(|(name, family)| {
            let attributes = |m: &prometheus::proto::Metric| -> Vec<KeyValue> {
                m.get_label()
                    .iter()
                    .map(|l| string_attribute(l.name(), l.value()))
                    .collect()
            };
            let data = match family.get_field_type() {
                MetricType::GAUGE => metric::Data::Gauge(Gauge {
                    data_points: family
                        .get_metric()
                        .iter()
                        .map(|m| NumberDataPoint {
                            attributes: attributes(m),
                            start_time_unix_nano: start,
                            time_unix_nano: now,
                            value: Some(number_data_point::Value::AsDouble(
                                m.get_gauge().get_value(),
                            )),
                            ..NumberDataPoint::default()
                        })
                        .collect(),
                }),
                MetricType::HISTOGRAM => metric::Data::Histogram(Histogram {
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    data_points: family
                        .get_metric()
                        .iter()
                        .map(|m| {
                            let h = m.get_histogram();
                            // Prometheus buckets are cumulative and end at +Inf implicitly;
                            // OTLP wants per-bucket counts plus an overflow bucket.
                            let mut bounds = Vec::new();
                            let mut counts = Vec::new();
                            let mut below = 0;
                            for b in h
                                .get_bucket()
                                .iter()
                                .filter(|b| b.upper_bound().is_finite())
                            {
                                bounds.push(b.upper_bound());
                                counts.push(b.cumulative_count().saturating_sub(below));
                                below = b.cumulative_count();
                            }
                            counts.push(h.get_sample_count().saturating_sub(below));
                            HistogramDataPoint {
                                attributes: attributes(m),
                                start_time_unix_nano: start,
                                time_unix_nano: now,
                                count: h.get_sample_count(),
                                sum: Some(h.get_sample_sum()),
                                bucket_counts: counts,
                                explicit_bounds: bounds,
                                ..HistogramDataPoint::default()
                            }
                        })
                        .collect(),
                }),
                _ => return None,
            };
            Some(Metric {
                name: name.clone(),
                description: family.help().to_owned(),
                unit: "1".into(),
                data: Some(data),
                ..Metric::default()
            })
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    string_attribute("service.name", "perago-sidecar"),
                    string_attribute("service.instance.id", instance_id),
                ],
                ..Resource::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "perago".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                metrics,
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    }
}

/// Sends export requests.
pub struct Exporter {
    config: OtlpConfig,
    http: reqwest::Client,
}

impl Exporter {
    pub fn new(config: OtlpConfig) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(config.timeout).build()?;
        Ok(Self { config, http })
    }

    pub fn interval(&self) -> Duration {
        self.config.interval
    }

    /// POST one request; errors are logged (the next export carries the cumulative values).
    pub async fn export(&self, request: &ExportMetricsServiceRequest) {
        let body = request.encode_to_vec();
        match post(&self.http, &self.config.endpoint, self.config.gzip, body).await {
            Ok(()) => debug!("exported metrics over OTLP"),
            Err(e) => {
                warn!(error = %e, endpoint = %self.config.endpoint, "exporting metrics over OTLP failed")
            }
        }
    }
}

/// An OTLP export that was not accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    /// The endpoint answered with a failure status.
    #[error("the endpoint answered {0}")]
    Refused(reqwest::StatusCode),
    /// The endpoint could not be reached, or its answer did not come; the text holds the
    /// request error's whole chain, so the error has no separate source.
    #[error("{}", perago_contract::error_chain(.0))]
    Unreachable(reqwest::Error),
}

/// POST one OTLP/HTTP protobuf request, gzip-compressed when asked. The error says whether
/// the endpoint answered (and with what) or could not be reached.
pub(crate) async fn post(
    http: &reqwest::Client,
    endpoint: &str,
    gzip: bool,
    mut body: Vec<u8>,
) -> Result<(), ExportError> {
    let mut builder = http
        .post(endpoint)
        .header("Content-Type", "application/x-protobuf");
    if gzip {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        match encoder.write_all(&body).and_then(|()| encoder.finish()) {
            Ok(compressed) => {
                body = compressed;
                builder = builder.header("Content-Encoding", "gzip");
            }
            Err(e) => {
                warn!(error = %e, "compressing an OTLP export failed; sending it uncompressed")
            }
        }
    }
    match builder.body(body).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(ExportError::Refused(r.status())),
        Err(e) => Err(ExportError::Unreachable(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn configuration_follows_0_6_1() {
        assert_eq!(OtlpConfig::from_lookup(lookup(&[])), Ok(None));
        // Without an endpoint the other values are ignored, even invalid ones.
        assert_eq!(
            OtlpConfig::from_lookup(lookup(&[(
                "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
                "deflate"
            )])),
            Ok(None)
        );
        let ep = (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://c:4318/custom/path",
        );
        let c = OtlpConfig::from_lookup(lookup(&[ep])).unwrap().unwrap();
        assert_eq!(c.endpoint, "http://c:4318/custom/path");
        assert_eq!(
            (c.gzip, c.timeout, c.interval),
            (false, Duration::from_secs(10), Duration::from_secs(60))
        );
        for (vars, message) in [
            (
                vec![("OTEL_SERVICE_NAME", "x")],
                "OTEL_SERVICE_NAME is not supported by Perago metrics v1",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "replace-me")],
                "OTEL_EXPORTER_OTLP_ENDPOINT must be replaced with a real value",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "replace-me")],
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT must be replaced with a real value",
            ),
            (
                vec![ep, ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "none")],
                "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION must be 'gzip'",
            ),
            (
                vec![ep, ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "1.5")],
                "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT must be a positive integer number of milliseconds",
            ),
            (
                vec![ep, ("OTEL_METRIC_EXPORT_INTERVAL", "0")],
                "OTEL_METRIC_EXPORT_INTERVAL must be greater than zero",
            ),
        ] {
            assert_eq!(
                OtlpConfig::from_lookup(lookup(&vars)).map_err(String::from),
                Err(message.to_owned())
            );
        }
        let c = OtlpConfig::from_lookup(lookup(&[
            ep,
            ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", " GZIP "),
            ("OTEL_METRIC_EXPORT_INTERVAL", "250"),
        ]))
        .unwrap()
        .unwrap();
        assert!(c.gzip);
        assert_eq!(c.interval, Duration::from_millis(250));
    }

    #[test]
    fn histograms_become_per_bucket_counts() {
        let registry = prometheus::Registry::new();
        let h = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("app_items", "items").buckets(vec![1.0, 5.0]),
            &["task_name"],
        )
        .unwrap();
        registry.register(Box::new(h.clone())).unwrap();
        for v in [0.5, 3.0, 4.0, 9.0] {
            h.with_label_values(&["t"]).observe(v);
        }
        let families: Vec<_> = registry
            .gather()
            .into_iter()
            .map(|f| ("app.items".to_owned(), f))
            .collect();
        let req = request(
            &families,
            "pod-a",
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::from_secs(1),
        );
        let decoded = ExportMetricsServiceRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        let metric = &decoded.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(
            (metric.name.as_str(), metric.unit.as_str()),
            ("app.items", "1")
        );
        let Some(metric::Data::Histogram(hist)) = &metric.data else {
            panic!("not a histogram: {metric:?}");
        };
        let point = &hist.data_points[0];
        assert_eq!(point.explicit_bounds, vec![1.0, 5.0]);
        assert_eq!(point.bucket_counts, vec![1, 2, 1]);
        assert_eq!((point.count, point.sum), (4, Some(16.5)));
        assert_eq!(point.attributes, vec![string_attribute("task_name", "t")]);
        assert_eq!(
            hist.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
    }
}
