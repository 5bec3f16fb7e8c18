//! Sizes as people write them on command lines (`8GiB`, `512MiB`, `2G`),
//! for every flag that takes one (`loader-worker --memory-budget`,
//! `loader-server --blob-budget`).

/// Parses a size as a person writes it: `8GiB`, `512MiB`, `2G`, `1000000`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit_bytes: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => f64::from(1u32 << 20),
        "gi" | "gib" => f64::from(1u32 << 30),
        "ti" | "tib" => (1u64 << 40) as f64,
        _ => return Err(format!("unknown unit in {s:?}; expected e.g. 8GiB, 512MiB, 2G or a number of bytes")),
    };
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n * unit_bytes < u64::MAX as f64 => Ok((n * unit_bytes) as u64),
        _ => Err(format!("expected a positive size such as 8GiB, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_written_or_say_what_is_expected() {
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1000000"), Ok(1_000_000));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        for bad in ["", "0", "-1G", "8 parsecs", "G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
