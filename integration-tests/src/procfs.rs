//! What `/proc` says about a process, for benchmarks that report CPU and memory beside their figures.

/// CPU seconds (user + system, all threads) process `pid` has used so far; 0 when it cannot be read.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime is field 14 and stime 15 of the whole line, i.e. 11 and 12 after the ')'; USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident set size (VmRSS) of process `pid`, in KiB; 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}
