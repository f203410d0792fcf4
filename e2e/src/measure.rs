//! What the benchmarks read off the machine: the CPU time and peak memory of processes and
//! process trees from `/proc`, and counters from a Prometheus text exposition.

use std::collections::BTreeMap;

/// The pids of every process named `comm`.
pub fn processes(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim() == comm)
        })
        .collect()
}

/// utime + stime of every process named `comm`, in seconds.
pub fn cpu_seconds(comm: &str) -> f64 {
    cpu_of(processes(comm))
}

/// utime + stime of the processes named `comm` below `root` (a run's own server, not another
/// run's of the same name), in seconds.
pub fn cpu_seconds_below(root: u32, comm: &str) -> f64 {
    let below = ProcessTree::new(root).members();
    cpu_of(
        processes(comm)
            .into_iter()
            .filter(|pid| below.contains(pid))
            .collect(),
    )
}

fn cpu_of(pids: Vec<u32>) -> f64 {
    pids.into_iter()
        .filter_map(stat_fields)
        .map(|f| {
            (11..=12)
                .filter_map(|i| f.get(i)?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum::<f64>()
        / USER_HZ
}

/// The largest peak resident set (`VmHWM`) of the processes named `comm`, in MiB.
pub fn peak_rss_mib(comm: &str) -> f64 {
    largest_mib(comm, "VmHWM:")
}

/// The largest resident set now (`VmRSS`) of the processes named `comm`, in MiB.
pub fn rss_mib(comm: &str) -> f64 {
    largest_mib(comm, "VmRSS:")
}

fn largest_mib(comm: &str, field: &str) -> f64 {
    processes(comm)
        .into_iter()
        .filter_map(|pid| status_kib(pid, field))
        .fold(0.0, f64::max)
        / 1024.0
}

const USER_HZ: f64 = 100.0;

/// `/proc/<pid>/stat` after the parenthesised command name, split on whitespace: the
/// process state is field 0, the parent 1, the process group 2, utime 11, stime 12, cutime
/// 13 and cstime 14.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn status_kib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix(field)?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// A process and every process below it, measured from `/proc`: the peak resident memory
/// of the tree (the sum of each member's own peak, sampled) and its CPU time, the reaped
/// children's included.
pub struct ProcessTree {
    root: u32,
    peaks_kib: BTreeMap<u32, f64>,
}

impl ProcessTree {
    pub fn new(root: u32) -> Self {
        Self {
            root,
            peaks_kib: BTreeMap::new(),
        }
    }

    /// The root and its live descendants.
    pub fn members(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return vec![self.root];
        };
        let parents: Vec<(u32, u32)> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| Some((pid, stat_fields(pid)?.get(1)?.parse().ok()?)))
            .collect();
        let mut members = vec![self.root];
        let mut i = 0;
        while let Some(&parent) = members.get(i) {
            members.extend(
                parents
                    .iter()
                    .filter(|(_, p)| *p == parent)
                    .map(|(c, _)| *c),
            );
            i += 1;
        }
        members
    }

    /// Forget the peaks so far, the kernel's included (`clear_refs` 5 resets `VmHWM`; it
    /// needs the right to write the processes' `clear_refs`, which their owner and root have).
    pub fn reset_peaks(&mut self) {
        self.peaks_kib.clear();
        for pid in self.members() {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
    }

    /// Record each member's peak so far; call it often enough to see short-lived members.
    pub fn sample(&mut self) {
        for pid in self.members() {
            if let Some(kib) = status_kib(pid, "VmHWM:") {
                let peak = self.peaks_kib.entry(pid).or_insert(0.0);
                *peak = peak.max(kib);
            }
        }
    }

    /// The sum of the members' peaks since the last reset, in MiB: an upper bound of the
    /// tree's peak, and its peak when the members peak together.
    pub fn peak_mib(&self) -> f64 {
        self.peaks_kib.values().sum::<f64>() / 1024.0
    }

    /// CPU seconds (user + system) of the live members and of the children they reaped.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_seconds_by_member().values().sum()
    }

    /// CPU seconds (user + system) of each live member, the children it reaped included.
    pub fn cpu_seconds_by_member(&self) -> BTreeMap<u32, f64> {
        self.members()
            .into_iter()
            .filter_map(|pid| {
                let fields = stat_fields(pid)?;
                let ticks = (11..=14)
                    .filter_map(|i| fields.get(i)?.parse::<f64>().ok())
                    .sum::<f64>();
                Some((pid, ticks / USER_HZ))
            })
            .collect()
    }
}

/// The Prometheus text exposition served at `url`; a benchmark that cannot read it stops,
/// naming the URL.
pub async fn scrape(url: &str) -> String {
    let response = reqwest::get(url).await.and_then(|r| r.error_for_status());
    let text = match response {
        Ok(response) => response.text().await,
        Err(e) => Err(e),
    };
    text.unwrap_or_else(|e| panic!("reading the metrics at {url}: {e}"))
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

    #[test]
    fn a_process_tree_holds_its_children_and_their_memory() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let mut tree = ProcessTree::new(std::process::id());
        assert!(tree.members().contains(&child.id()));
        tree.reset_peaks();
        tree.sample();
        assert!(tree.peak_mib() > 0.0);
        let busy = std::time::Instant::now();
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(busy.elapsed());
        }
        assert!(tree.cpu_seconds() > 0.0);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
