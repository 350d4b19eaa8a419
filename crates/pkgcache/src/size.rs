//! Sizes as people type and read them: `500M`, `2G`, `1.5 GiB`. Units are
//! binary (M = MiB) because that is how `du -h` and `ls -h` print them.

/// Parses `123`, `500K`, `500M`, `2G`, `1.5T`, with an optional `B`/`iB`/`i`
/// suffix (`500MB`, `500MiB`, `2Gi` as in manifests), case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let unit_start = lower.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(unit_start);
    let shift = match unit.trim() {
        "" | "b" => 0,
        "k" | "kb" | "ki" | "kib" => 10,
        "m" | "mb" | "mi" | "mib" => 20,
        "g" | "gb" | "gi" | "gib" => 30,
        "t" | "tb" | "ti" | "tib" => 40,
        _ => return Err(format!("unknown size unit in {t:?} (use K, M, G or T)")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("not a size: {t:?} (e.g. 500M, 2G)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("not a size: {t:?}"));
    }
    let bytes = value * (1u64 << shift) as f64;
    if bytes > u64::MAX as f64 {
        return Err(format!("size too large: {t:?}"));
    }
    Ok(bytes.round() as u64)
}

/// `1536` → `1.5 KiB`; one decimal is enough to compare entries at a glance.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_people_sizes() {
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("500mb"), Ok(500 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("64mi"), Ok(64 << 20));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn formats_with_binary_units() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(2 << 30), "2.0 GiB");
    }
}
