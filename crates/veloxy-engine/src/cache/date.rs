//! HTTP-dates as a cache reads them (`Expires`, `Date`, `Last-Modified`, `If-Modified-Since`).
//!
//! Hand-written because the `httpdate` crate, which veloxy uses to write dates, is strict in
//! two ways that cost a cache hits for no safety gain: it refuses names in another case
//! (`THU`, `AUG`, `gmt`) and it refuses a date whose weekday does not match the day. RFC 9110
//! section 5.6.7 asks recipients to accept all three formats; like Traffic Server and
//! Squid, this parser also ignores the case of names and does not check the weekday, which
//! carries no information. Everything else stays strict, as the HTTP caching test suite
//! expects: two-digit years only in the RFC 850 format, one space between fields, a comma
//! after the weekday, two-digit time fields and `GMT` as the only zone.

/// Unix seconds of an `HTTP-date` in any of the three formats of RFC 9110 section 5.6.7
/// (IMF-fixdate, RFC 850, asctime), or `None` when it is not one.
pub(crate) fn parse(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?.trim_matches([' ', '\t']);
    let (date, time, year) = imf_fixdate(s)
        .or_else(|| rfc850(s))
        .or_else(|| asctime(s))?;
    unix(date, time, year)
}

/// (day, month 1-12), (hour, minute, second), year.
type Parts = ((u32, u32), (u32, u32, u32), i64);

const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const LONG_WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];
const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(s: &str) -> Option<Parts> {
    let (wday, rest) = s.split_once(", ")?;
    one_of(wday, &WEEKDAYS)?;
    let f: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, zone] = f.as_slice() else {
        return None;
    };
    zone.eq_ignore_ascii_case("gmt").then_some(())?;
    let year = digits(year, 4)?;
    Some((
        (digits(day, 2)?, month_of(month)?),
        clock(time)?,
        i64::from(year),
    ))
}

/// `Sunday, 06-Nov-94 08:49:37 GMT` (a two-digit year: 70-99 are 19xx, the others 20xx).
fn rfc850(s: &str) -> Option<Parts> {
    let (wday, rest) = s.split_once(", ")?;
    one_of(wday, &LONG_WEEKDAYS)?;
    let f: Vec<&str> = rest.split(' ').collect();
    let [date, time, zone] = f.as_slice() else {
        return None;
    };
    zone.eq_ignore_ascii_case("gmt").then_some(())?;
    let d: Vec<&str> = date.split('-').collect();
    let [day, month, year] = d.as_slice() else {
        return None;
    };
    let yy = i64::from(digits(year, 2)?);
    let year = if yy >= 70 { 1900 + yy } else { 2000 + yy };
    Some(((digits(day, 2)?, month_of(month)?), clock(time)?, year))
}

/// `Sun Nov  6 08:49:37 1994` (the day padded with a space to two characters).
fn asctime(s: &str) -> Option<Parts> {
    let b = s.as_bytes();
    if b.len() != 24 || b[3] != b' ' || b[7] != b' ' || b[10] != b' ' || b[19] != b' ' {
        return None;
    }
    one_of(&s[..3], &WEEKDAYS)?;
    let month = month_of(&s[4..7])?;
    let day = match (b[8], b[9]) {
        (b' ', d) if d.is_ascii_digit() => u32::from(d - b'0'),
        _ => digits(&s[8..10], 2)?,
    };
    let year = i64::from(digits(&s[20..24], 4)?);
    Some(((day, month), clock(&s[11..19])?, year))
}

fn one_of(name: &str, names: &[&str]) -> Option<usize> {
    names.iter().position(|n| n.eq_ignore_ascii_case(name))
}

fn month_of(name: &str) -> Option<u32> {
    one_of(name, &MONTHS).map(|i| i as u32 + 1)
}

/// Exactly `n` ASCII digits.
fn digits(s: &str, n: usize) -> Option<u32> {
    (s.len() == n && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `HH:MM:SS`, two digits each.
fn clock(s: &str) -> Option<(u32, u32, u32)> {
    let f: Vec<&str> = s.split(':').collect();
    let [h, m, sec] = f.as_slice() else {
        return None;
    };
    let (h, m, sec) = (digits(h, 2)?, digits(m, 2)?, digits(sec, 2)?);
    (h < 24 && m < 60 && sec <= 60).then_some((h, m, sec))
}

/// Seconds since 1970 (dates before it are refused), with the day checked against the
/// month's length.
fn unix((day, month): (u32, u32), (h, m, s): (u32, u32, u32), year: i64) -> Option<u64> {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let len = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if day == 0 || day > len[month as usize - 1] {
        return None;
    }
    // Days from civil (H. Hinnant's algorithm), for the proleptic Gregorian calendar.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + i64::from(h * 3600 + m * 60 + s);
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_three_formats_agree_with_httpdate() {
        let t = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(t));
        assert_eq!(parse(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(parse(b"Sun Nov  6 08:49:37 1994"), Some(t));
        for secs in [
            0u64,
            951_782_400,
            2_147_483_648,
            4_102_444_800,
            10_000_000_000,
        ] {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            let text = httpdate::fmt_http_date(at);
            assert_eq!(parse(text.as_bytes()), Some(secs), "{text}");
        }
    }

    #[test]
    fn names_in_any_case_and_a_wrong_weekday_are_accepted() {
        let t = parse(b"Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        for v in [
            "THU, 18 Aug 2050 02:01:18 GMT",
            "Thu, 18 AUG 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02:01:18 gMT",
            "Mon, 18 Aug 2050 02:01:18 GMT",
            "Thursday, 18-Aug-50 02:01:18 GMT",
        ] {
            assert_eq!(parse(v.as_bytes()), Some(t), "{v}");
        }
        assert!(parse(b"Thu Aug  8 02:01:18 2050").is_some());
    }

    #[test]
    fn malformed_dates_are_refused() {
        for v in [
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 2050 02:01:18 AEST",
            "Thu, 18 Aug 50 02:01:18 GMT",
            "Thu 18 Aug 2050 02:01:18 GMT",
            "Thu, 18  Aug  2050 02:01:18 GMT",
            "Thu, 18-Aug-2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02.01.18 GMT",
            "Thu, 18 Aug 2050 2:01:18 GMT",
            "Thu, 31 Feb 2050 02:01:18 GMT",
            "Thu, 18 Aug 1950 24:00:00 GMT",
            "0",
            "",
            "foo",
        ] {
            assert_eq!(parse(v.as_bytes()), None, "{v}");
        }
    }
}
