//! Node identity: the one definition of "same machine", shared by workers and
//! trainers so the coordinator can pair co-located processes by comparing
//! strings.

/// This machine's identity: `<hostname>/<boot id>`, or just the hostname when
/// the boot id is unreadable (non-Linux). The boot id tells two containers
/// with the same hostname on different machines apart, and a rebooted machine
/// from its former self. An explicit identity (e.g. the Kubernetes node name
/// from the downward API) overrides this wherever a process takes a `node`.
pub fn local_node() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let host = read("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned());
    match read("/proc/sys/kernel/random/boot_id") {
        Some(boot) => format!("{host}/{boot}"),
        None => host,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_node_is_stable_and_non_empty() {
        let a = super::local_node();
        assert!(!a.is_empty());
        assert_eq!(a, super::local_node());
    }
}
