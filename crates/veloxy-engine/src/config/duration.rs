//! Human durations in the config: `"500ms"`, `"2s"`, `"1m"`, `"1h"`, `"30d"`, `"250us"`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A parsed duration; a bad string is a deserialization error, which TOML reports at its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationValue(pub Duration);

/// Parses `<number><unit>` where unit is `us`, `ms`, `s`, `m`, `h` or `d`; the number may have a fraction.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| {
            format!("invalid duration {s:?}: missing unit (use us, ms, s, m, h or d)")
        })?;
    let (num, unit) = s.split_at(split);
    if unit.starts_with(char::is_whitespace) {
        return Err(format!(
            "invalid duration {s:?}: no space between number and unit (e.g. \"30s\")"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: {num:?} is not a number"))?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {unit:?} (use us, ms, s, m, h or d)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("invalid duration {s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a duration string such as "500ms" or "2s""#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationValue, E> {
                parse_duration(v).map(DurationValue).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86400)
        );
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse_duration("2").unwrap_err().contains("missing unit"));
        assert!(parse_duration("2 parsecs")
            .unwrap_err()
            .contains("no space"));
        assert!(parse_duration("2parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("not a number"));
        assert!(parse_duration("").is_err());
    }
}
