//! Human sizes on the command line: `64MiB`, `4GiB`, `512KiB`, `1048576`.

/// Parses a size in bytes. Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`,
/// `G`, `T`) and decimal ones (`KB`, `MB`, `GB`, `TB`); no unit (or `B`) means bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|c| *c != '_').collect();
    if num.is_empty() {
        return Err(format!(
            "invalid size '{s}': expected a number such as 64MiB"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size '{s}': number too large"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "MiB" | "Mi" => 1 << 20,
        "G" | "GiB" | "Gi" => 1 << 30,
        "T" | "TiB" | "Ti" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "invalid size '{s}': unknown unit '{u}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("invalid size '{s}': too large"))?;
    if v == 0 {
        return Err(format!("invalid size '{s}': must be greater than zero"));
    }
    Ok(v)
}

/// [`parse_size`] that also takes zero (`0`, `0MiB`): for sizes where zero turns a feature
/// off.
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Err(e) if e.ends_with("must be greater than zero") => Ok(0),
        r => r,
    }
}

/// Formats bytes with the largest binary unit that divides them exactly (else with decimals).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (u, m) in UNITS {
        if bytes >= m {
            return if bytes % m == 0 {
                format!("{}{u}", bytes / m)
            } else {
                format!("{:.1}{u}", bytes as f64 / m as f64)
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size_or_zero("0"), Ok(0));
        assert_eq!(parse_size_or_zero("0MiB"), Ok(0));
        assert_eq!(parse_size_or_zero("2KiB"), Ok(2048));
        assert!(parse_size("0").is_err());
        assert!(parse_size_or_zero("x").is_err());
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1_048_576"), Ok(1 << 20));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size(" 8 MiB "), Ok(8 << 20));
    }

    #[test]
    fn rejects_bad_sizes_with_a_reason() {
        assert!(parse_size("").unwrap_err().contains("expected a number"));
        assert!(parse_size("MiB").unwrap_err().contains("expected a number"));
        assert!(parse_size("64XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("0").unwrap_err().contains("greater than zero"));
        assert!(
            parse_size("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_size("-5MiB").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1536), "1.5KiB");
        assert_eq!(format_size(100), "100B");
    }
}
