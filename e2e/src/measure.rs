//! What the benchmarks read off the machine: a process's CPU time and peak memory from
//! `/proc`, and counters from a Prometheus text exposition.

use std::collections::BTreeMap;

/// The `/proc/<pid>` directories of every process named `comm`.
fn processes(comm: &str) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|path| {
            std::fs::read_to_string(path.join("comm")).is_ok_and(|name| name.trim() == comm)
        })
        .collect()
}

/// utime + stime of every process named `comm`, in seconds.
pub fn cpu_seconds(comm: &str) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for path in processes(comm) {
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // Fields after the `(comm)`: state is the 3rd field, utime the 14th, stime the 15th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: f64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        let stime: f64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        total += (utime + stime) / ticks;
    }
    total
}

/// The largest peak resident set (`VmHWM`) of the processes named `comm`, in MiB.
pub fn peak_rss_mib(comm: &str) -> f64 {
    processes(comm)
        .iter()
        .filter_map(|path| std::fs::read_to_string(path.join("status")).ok())
        .filter_map(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
        })
        .fold(0.0, f64::max)
        / 1024.0
}

/// The samples of the counter `name` in a Prometheus text exposition, summed by the values
/// of `labels` (joined by `/`).
pub fn counter_by(text: &str, name: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    let prefix = format!("{name}{{");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((set, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            set.split(',')
                .find_map(|l| l.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let key: Vec<String> = labels.iter().map(|l| label(l)).collect();
        *sums.entry(key.join("/")).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    sums
}

/// `after - before` for every key of `after`.
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_by_the_labels_asked_for() {
        let text = "# HELP x\nreq_total{verb=\"GET\",resource=\"pods\",code=\"200\"} 3\nreq_total{verb=\"GET\",resource=\"pods\",code=\"404\"} 1\nreq_total{verb=\"PATCH\",resource=\"pods\"} 2\nother_total{verb=\"GET\"} 9\n";
        let sums = counter_by(text, "req_total", &["verb", "resource"]);
        assert_eq!(sums["GET/pods"], 4.0);
        assert_eq!(sums["PATCH/pods"], 2.0);
        assert_eq!(sums.len(), 2);
        let before = BTreeMap::from([("GET/pods".to_owned(), 1.0)]);
        assert_eq!(delta(&before, &sums)["GET/pods"], 3.0);
        assert!(cpu_seconds("no-such-process-name") == 0.0);
    }
}
