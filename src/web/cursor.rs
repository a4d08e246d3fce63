//! Page cursors for keyset pagination: the sort key of the last row a page
//! showed (whether it was open, for lists that show open rows first; its
//! time; its id), opaque to clients. Pages compare rows with these values,
//! never with a row looked up again: a row that changed or went since
//! cannot shift the next page, and a cursor names nothing of anyone else's.

use time::OffsetDateTime;

use super::error::AppError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub open: bool,
    pub at: OffsetDateTime,
    pub id: i64,
}

impl Cursor {
    /// Before every row: the first page.
    pub fn first() -> Cursor {
        Cursor {
            open: true,
            at: time::macros::datetime!(9999-12-31 0:00 UTC),
            id: i64::MAX,
        }
    }

    /// The cursor after a row.
    pub fn after(open: bool, at: OffsetDateTime, id: i64) -> Cursor {
        Cursor { open, at, id }
    }

    /// `1.1767225600000000.42`: open, microseconds since 1970, id.
    pub fn encode(&self) -> String {
        let micros = self.at.unix_timestamp_nanos() / 1000;
        format!("{}.{micros}.{}", u8::from(self.open), self.id)
    }

    /// A cursor as sent (`field` names it in the message); empty or absent:
    /// the first page.
    pub fn parse(raw: Option<&str>, field: &str) -> Result<Cursor, AppError> {
        let raw = match raw.map(str::trim).filter(|c| !c.is_empty()) {
            None => return Ok(Cursor::first()),
            Some(r) => r,
        };
        let bad = || AppError::invalid(field, "a cursor is the one a previous page gave");
        let mut parts = raw.split('.');
        let (Some(o), Some(m), Some(i), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let open = match o {
            "0" => false,
            "1" => true,
            _ => return Err(bad()),
        };
        let micros: i64 = m.parse().ok().filter(|m| *m >= 0).ok_or_else(bad)?;
        let id: i64 = i.parse().ok().filter(|i| *i > 0).ok_or_else(bad)?;
        // A time past the last one a row can have reads as that one (every
        // well-formed cursor is taken; none names a row that cannot exist).
        let last = (Cursor::first().at.unix_timestamp_nanos() / 1000) as i64;
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros.min(last)) * 1000)
            .map_err(|_| bad())?;
        Ok(Cursor { open, at, id })
    }

    /// Whether this is the first page's cursor.
    pub fn is_first(&self) -> bool {
        *self == Cursor::first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_comes_back_as_it_went() {
        let c = Cursor::after(
            false,
            time::macros::datetime!(2026-12-03 10:11:12.345678 UTC),
            42,
        );
        assert_eq!(Cursor::parse(Some(&c.encode()), "cursor").unwrap(), c);
        assert!(Cursor::parse(None, "cursor").unwrap().is_first());
        assert!(Cursor::parse(Some(""), "cursor").unwrap().is_first());
        for bad in [
            "abc",
            "1.2",
            "2.1.1",
            "1.x.1",
            "1.1.0",
            "1.1.-3",
            "1.1.1.1",
            "0.-99999999999999.1",
        ] {
            assert!(Cursor::parse(Some(bad), "cursor").is_err(), "{bad}");
        }
        // Far in the future (as a fuzzer sends it): the last possible time.
        let far = Cursor::parse(Some("1.428431936226510582.78"), "cursor").unwrap();
        assert_eq!((far.at, far.id), (Cursor::first().at, 78));
    }
}
