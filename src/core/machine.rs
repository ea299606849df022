//! The machine a measurement of speed is taken on, as one line: the CPU
//! (what `/proc/cpuinfo` says the processors are, not how fast they clock
//! now), the CPUs this process may use, the memory (in GiB) and the host
//! name. Contract: the same machine gives the same line from one run to the
//! next; a line is given only when the CPU is known, so a speed result is
//! never keyed by a machine we could not tell apart from another.

/// This machine, or None when its CPU cannot be read (not Linux, or a
/// `/proc/cpuinfo` without a processor model).
pub(crate) fn describe() -> Option<String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    describe_from(
        &read("/proc/cpuinfo"),
        &read("/proc/meminfo"),
        read("/proc/sys/kernel/hostname").trim(),
        cpus,
    )
}

/// [`describe`] from the texts it reads: the distinct values of the
/// `/proc/cpuinfo` keys that name a processor model (x86's vendor, family,
/// model, stepping and cache; Arm's implementer, part, variant and
/// revision), `MemTotal` rounded to GiB, `host` and `cpus`.
pub(crate) fn describe_from(
    cpuinfo: &str,
    meminfo: &str,
    host: &str,
    cpus: usize,
) -> Option<String> {
    const MODEL_KEYS: [&str; 12] = [
        "vendor_id",
        "cpu family",
        "model",
        "model name",
        "stepping",
        "cache size",
        "CPU implementer",
        "CPU architecture",
        "CPU variant",
        "CPU part",
        "CPU revision",
        "Hardware",
    ];
    let mut model: Vec<String> = Vec::new();
    for line in cpuinfo.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        let item = format!("{k}={v}");
        if MODEL_KEYS.contains(&k) && !v.is_empty() && !model.contains(&item) {
            model.push(item);
        }
    }
    if model.is_empty() {
        return None;
    }
    let kib: Option<u64> = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
    let gib = kib.map_or("?".to_string(), |k| {
        format!("{}", (k as f64 / (1024.0 * 1024.0)).round())
    });
    Some(format!(
        "cpu {} | {cpus} cpus | {gib} GiB | host {host}",
        model.join(", ")
    ))
}

/// A machine line ([`describe`], with the engine's ` | devices …` after
/// it) as a reader wants it beside a speed figure: the processor's model
/// name, the CPUs, the memory, and the GPUs among the devices (`no GPU`
/// when every device is a CPU); the host name and the processor's
/// identifying numbers are left out (they key results, they tell a reader
/// nothing).
pub(crate) fn plain(line: &str) -> String {
    let mut cpu: Option<String> = None;
    let mut cpu_fallback: Vec<String> = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    let mut gpus: Option<Vec<String>> = None;
    for field in line.split(" | ") {
        if let Some(model) = field.strip_prefix("cpu ") {
            for item in model.split(", ") {
                match item.split_once('=') {
                    Some(("model name", v)) => cpu = Some(v.to_string()),
                    Some(("CPU implementer" | "CPU part" | "Hardware", v)) => {
                        cpu_fallback.push(v.to_string())
                    }
                    _ => {}
                }
            }
        } else if let Some(n) = field.strip_suffix(" cpus") {
            parts.push(format!("{n} CPUs"));
        } else if field.ends_with(" GiB") {
            parts.push(format!("{field} RAM"));
        } else if let Some(devices) = field.strip_prefix("devices ") {
            // `name (description, bytes B)`, `; `-separated.
            gpus = Some(
                devices
                    .split("; ")
                    .filter(|d| !d.is_empty() && !d.starts_with("CPU"))
                    .map(|d| match d.split_once(" (") {
                        Some((_, rest)) => {
                            let rest = rest.trim_end_matches(')');
                            match rest.rsplit_once(", ") {
                                Some((what, bytes)) => {
                                    let gib = bytes
                                        .trim_end_matches(" B")
                                        .parse::<f64>()
                                        .map(|b| format!(" ({:.0} GiB)", b / (1u64 << 30) as f64))
                                        .unwrap_or_default();
                                    format!("{what}{gib}")
                                }
                                None => rest.to_string(),
                            }
                        }
                        None => d.to_string(),
                    })
                    .collect(),
            );
        }
    }
    let cpu = cpu.unwrap_or_else(|| match cpu_fallback.is_empty() {
        true => "an unnamed CPU".into(),
        false => format!("CPU {}", cpu_fallback.join(" ")),
    });
    let mut out = vec![cpu];
    out.extend(parts);
    match gpus {
        Some(g) if g.is_empty() => out.push("no GPU".into()),
        Some(g) => out.push(format!("GPU {}", g.join(", "))),
        None => {}
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz\nstepping\t: 7\ncpu MHz\t\t: 2499.998\ncache size\t: 36608 KB\nbogomips\t: 4999.99\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz\nstepping\t: 7\ncpu MHz\t\t: 2600.114\ncache size\t: 36608 KB\nbogomips\t: 5001.02\n";
    const MEM: &str = "MemTotal:       24583140 kB\nMemFree:         1000000 kB\n";

    /// What the processors are decides the line, not how fast they clock
    /// at the moment it is read; another CPU, CPU count, memory or host is
    /// another machine, and an unreadable CPU is no machine at all.
    #[test]
    fn a_machine_is_its_cpu_model_cpus_memory_and_host() {
        let line = describe_from(X86, MEM, "ci-1", 2).unwrap();
        assert_eq!(
            line,
            "cpu vendor_id=GenuineIntel, cpu family=6, model=85, model name=Intel(R) Xeon(R) \
             Platinum 8259CL CPU @ 2.50GHz, stepping=7, cache size=36608 KB | 2 cpus | 23 GiB | host ci-1"
        );
        let clocked = X86
            .replace("2499.998", "1200.000")
            .replace("5001.02", "4000.00");
        assert_eq!(describe_from(&clocked, MEM, "ci-1", 2).unwrap(), line);
        let others = [
            describe_from(&X86.replace("8259CL", "8375C"), MEM, "ci-1", 2),
            describe_from(X86, MEM, "ci-1", 4),
            describe_from(X86, "MemTotal: 65000000 kB\n", "ci-1", 2),
            describe_from(X86, MEM, "ci-2", 2),
        ];
        for o in others {
            assert_ne!(o.unwrap(), line);
        }
        let arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n";
        assert!(describe_from(arm, MEM, "a", 8)
            .unwrap()
            .contains("CPU part=0xd0c"));
        assert_eq!(describe_from("", MEM, "a", 2), None);
        assert_eq!(
            describe_from("processor : 0\nbogomips : 1\n", MEM, "a", 2),
            None
        );
    }

    /// A reader sees the processor's name, CPUs, memory and GPUs, not the
    /// identifying numbers or the host.
    #[test]
    fn a_machine_line_reads_plainly() {
        let line = describe_from(X86, MEM, "ci-1", 2).unwrap();
        assert_eq!(
            plain(&format!("{line} | devices CPU (Intel Xeon, 25276194816 B)")),
            "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz, 2 CPUs, 23 GiB RAM, no GPU"
        );
        assert_eq!(
            plain(&format!(
                "{line} | devices CUDA0 (NVIDIA H100 80GB HBM3, 85045870592 B); CPU (Intel Xeon, 1 B)"
            )),
            "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz, 2 CPUs, 23 GiB RAM, GPU NVIDIA H100 \
             80GB HBM3 (79 GiB)"
        );
        assert_eq!(
            plain(&line),
            "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz, 2 CPUs, 23 GiB RAM"
        );
    }
}
