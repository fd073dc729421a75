//! `consume --format`: a kcat-style (`kcat -f`) template printed once per record.
//!
//! Tokens follow kcat where kcat defines the letter: `%s` value, `%S` value length,
//! `%R` value length as a 4-byte big-endian signed integer, `%k` key, `%K` key length
//! (-1 for a record without a key), `%t` topic, `%p` partition, `%o` offset, `%T`
//! timestamp (milliseconds since the epoch), `%h` headers (seglog records have none,
//! so it prints nothing). Besides kcat's: `%v` value (as `%s`), `%V` value length (as
//! `%S`), `%%` a percent sign. Escapes are those of [`super::escape`]. Keys and values
//! are written as their raw bytes.

use std::io::{self, Write};

use super::escape::escape_at;
use crate::engine::net::client::Record;

/// One part of a compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(Vec<u8>),
    Value,
    ValueLen,
    ValueLenBe32,
    Key,
    KeyLen,
    Topic,
    Partition,
    Offset,
    Timestamp,
}

/// A compiled `--format` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordFormat {
    pieces: Vec<Piece>,
}

impl RecordFormat {
    /// A clap value parser: compiles `text`, refusing unknown tokens and escapes.
    pub fn parse(text: &str) -> Result<RecordFormat, String> {
        let bytes = text.as_bytes();
        let mut pieces = Vec::new();
        let mut literal = Vec::new();
        let mut i = 0;
        while let Some(&c) = bytes.get(i) {
            match c {
                b'\\' => {
                    let (b, used) = escape_at(bytes, i)?;
                    literal.push(b);
                    i += used;
                }
                b'%' => {
                    let token = match bytes.get(i + 1) {
                        Some(b'%') => {
                            literal.push(b'%');
                            i += 2;
                            continue;
                        }
                        Some(b's' | b'v') => Piece::Value,
                        Some(b'S' | b'V') => Piece::ValueLen,
                        Some(b'R') => Piece::ValueLenBe32,
                        Some(b'k') => Piece::Key,
                        Some(b'K') => Piece::KeyLen,
                        Some(b't') => Piece::Topic,
                        Some(b'p') => Piece::Partition,
                        Some(b'o') => Piece::Offset,
                        Some(b'T') => Piece::Timestamp,
                        Some(b'h') => {
                            // No headers in seglog records: nothing to print.
                            i += 2;
                            continue;
                        }
                        Some(&other) => {
                            return Err(format!(
                                "unknown token %{} (use %s/%v %S/%V %R %k %K %t %p %o %T %h or %%)",
                                char::from(other).escape_default()
                            ))
                        }
                        None => {
                            return Err(
                                "a trailing % is not a token (write %% for a percent sign)".into()
                            )
                        }
                    };
                    if !literal.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    pieces.push(token);
                    i += 2;
                }
                _ => {
                    literal.push(c);
                    i += 1;
                }
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(RecordFormat { pieces })
    }

    /// Writes `r` (of `topic`/`partition`) through the template.
    pub fn write(
        &self,
        out: &mut impl Write,
        topic: &str,
        partition: u32,
        r: &Record,
    ) -> io::Result<()> {
        for piece in &self.pieces {
            match piece {
                Piece::Literal(b) => out.write_all(b)?,
                Piece::Value => out.write_all(&r.value)?,
                Piece::ValueLen => write!(out, "{}", r.value.len())?,
                Piece::ValueLenBe32 => {
                    let n = i32::try_from(r.value.len()).unwrap_or(i32::MAX);
                    out.write_all(&n.to_be_bytes())?;
                }
                Piece::Key => out.write_all(r.key.as_deref().unwrap_or_default())?,
                Piece::KeyLen => match &r.key {
                    Some(k) => write!(out, "{}", k.len())?,
                    None => out.write_all(b"-1")?,
                },
                Piece::Topic => out.write_all(topic.as_bytes())?,
                Piece::Partition => write!(out, "{partition}")?,
                Piece::Offset => write!(out, "{}", r.offset)?,
                Piece::Timestamp => write!(out, "{}", r.timestamp_ms)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, r: &Record) -> Vec<u8> {
        let mut out = Vec::new();
        RecordFormat::parse(template)
            .unwrap()
            .write(&mut out, "events", 3, r)
            .unwrap();
        out
    }

    #[test]
    fn every_token() {
        let r = Record {
            offset: 41,
            timestamp_ms: 1_700_000_000_123,
            key: Some(b"k\0y".to_vec()),
            value: b"v\nal".to_vec(),
        };
        assert_eq!(
            render("%t/%p@%o %T [%k](%K) [%s](%S) [%v](%V)%h 100%%\\n", &r),
            b"events/3@41 1700000000123 [k\0y](3) [v\nal](4) [v\nal](4) 100%\n"
        );
        assert_eq!(render("%R%s", &r), b"\0\0\0\x04v\nal");
        assert_eq!(render("\\t\\x41\\0", &r), b"\tA\0");
        let keyless = Record { key: None, ..r };
        assert_eq!(render("[%k]%K", &keyless), b"[]-1");
    }

    #[test]
    fn refusals() {
        for bad in ["%q", "%", "abc%", "\\q", "\\x4"] {
            assert!(RecordFormat::parse(bad).is_err(), "{bad}");
        }
    }
}
