//! Go-style durations ("5s", "100ms", "1m30s", "0"), as kine's flags take them.

use std::time::Duration;

pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("invalid duration {text:?}: expected a number"));
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("invalid duration {text:?}: missing unit (use e.g. 5s, 100ms, 1m)")),
            other => return Err(format!("invalid duration {text:?}: unknown unit {other:?}")),
        };
        total += value * seconds;
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("invalid duration {text:?}: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert!(parse("5").unwrap_err().contains("missing unit"));
        assert!(parse("5x").unwrap_err().contains("unknown unit"));
        assert!(parse("").is_err());
        assert!(parse("s").is_err());
    }
}
