//! Sizes and durations as people type them, the same everywhere: in
//! manifests (`memory: 128Mi`, `timeout: 5s`) and in command-line flags
//! (`--cache-budget 2G`, `--build-memory 1Gi`).

use std::time::Duration;

/// Why a size or a duration was refused; the message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

/// `123` (bytes), `500K`, `500M`, `2G`, `1.5T`, with an optional `B`, `i`
/// or `iB` (`500MB`, `128Mi`, `1.5 GiB`), case-insensitive. Units are
/// binary (M = MiB), as `du -h` prints them and as Kubernetes users write
/// `Mi`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
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
        _ => return Err(UnitError(format!("unknown size unit in {t:?} (use K, M, G or T, e.g. 128Mi)"))),
    };
    let value: f64 = number.trim().parse().map_err(|_| UnitError(format!("{t:?} is not a size like 128Mi or 2G")))?;
    if !value.is_finite() || value < 0.0 {
        return Err(UnitError(format!("{t:?} is not a size like 128Mi or 2G")));
    }
    let bytes = value * (1u64 << shift) as f64;
    if bytes >= u64::MAX as f64 {
        return Err(UnitError(format!("{t:?} is too large")));
    }
    Ok(bytes.round() as u64)
}

/// `250ms`, `5s`, `2m`, `1h`, `1.5s`, or a bare number in `bare` units
/// (manifests read a bare number as milliseconds; a flag named `-s` as
/// seconds). Zero and negative durations are refused.
pub fn parse_duration(text: &str, bare: Duration) -> Result<Duration, UnitError> {
    let t = text.trim();
    let units = [("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    let (number, unit_s) =
        units.iter().find_map(|(u, s)| t.strip_suffix(u).map(|n| (n, *s))).unwrap_or((t, bare.as_secs_f64()));
    let n: f64 =
        number.trim().parse().map_err(|_| UnitError(format!("{t:?} is not a duration like 250ms, 5s, 2m or 1h")))?;
    let secs = n * unit_s;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(UnitError(format!("{t:?} must be a positive duration")));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| UnitError(format!("{t:?} is too long")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (t, want) in [
            ("123", 123),
            ("0", 0),
            ("500M", 500 << 20),
            ("500mb", 500 << 20),
            ("128Mi", 128 << 20),
            ("64mi", 64 << 20),
            ("2G", 2 << 30),
            ("2Gi", 2 << 30),
            ("1.5 GiB", 3 << 29),
            ("512Ki", 512 << 10),
            ("1T", 1 << 40),
        ] {
            assert_eq!(parse_size(t), Ok(want), "{t}");
        }
        for t in ["12X", "M", "-1G", "lots", "", "NaN", "1e30T"] {
            assert!(parse_size(t).is_err(), "{t}");
        }
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis(1);
        for (t, want) in [
            ("250ms", Duration::from_millis(250)),
            ("5s", Duration::from_secs(5)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("750", Duration::from_millis(750)),
        ] {
            assert_eq!(parse_duration(t, ms), Ok(want), "{t}");
        }
        assert_eq!(parse_duration("90", Duration::from_secs(1)), Ok(Duration::from_secs(90)));
        for t in ["soon", "0", "0s", "-1s", "", "5x", "1e300h"] {
            assert!(parse_duration(t, ms).is_err(), "{t}");
        }
    }
}
