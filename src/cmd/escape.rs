//! Byte strings typed on the command line: `--delimiter '\r\n'`, `--key-delimiter '\t'`
//! and the literal parts of `consume --format`. The escapes understood are `\n`, `\r`,
//! `\t`, `\0`, `\\` and `\xNN` (two hex digits, any byte); a backslash before anything
//! else is refused, so a typo never becomes a silent literal.

/// Bytes given on the command line with escapes resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

/// A clap value parser: `text` with its escapes resolved.
pub fn parse_bytes(text: &str) -> Result<Bytes, String> {
    unescape(text.as_bytes()).map(Bytes)
}

/// Resolves the escapes of `text`.
pub fn unescape(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while let Some(&c) = text.get(i) {
        if c == b'\\' {
            let (byte, used) = escape_at(text, i)?;
            out.push(byte);
            i += used;
        } else {
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

/// The byte an escape starting at `text[at] == b'\\'` stands for, and how many input
/// bytes it took.
pub fn escape_at(text: &[u8], at: usize) -> Result<(u8, usize), String> {
    let simple = |b| Ok((b, 2));
    match text.get(at + 1) {
        Some(b'n') => simple(b'\n'),
        Some(b'r') => simple(b'\r'),
        Some(b't') => simple(b'\t'),
        Some(b'0') => simple(0),
        Some(b'\\') => simple(b'\\'),
        Some(b'x') => {
            let digits = text
                .get(at + 2..at + 4)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| u8::from_str_radix(d, 16).ok());
            match digits {
                Some(b) => Ok((b, 4)),
                None => Err("\\x must be followed by two hex digits, as in \\x00 or \\xff".into()),
            }
        }
        Some(&other) => Err(format!(
            "unknown escape \\{} (use \\n, \\r, \\t, \\0, \\\\ or \\xNN)",
            char::from(other).escape_default()
        )),
        None => Err("a trailing backslash escapes nothing (write \\\\ for a backslash)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(unescape(b"a\\nb").unwrap(), b"a\nb");
        assert_eq!(unescape(b"\\r\\n").unwrap(), b"\r\n");
        assert_eq!(unescape(b"\\t\\0\\\\").unwrap(), b"\t\0\\");
        assert_eq!(unescape(b"\\x00\\xFF\\x7f").unwrap(), [0, 0xff, 0x7f]);
        assert_eq!(unescape(b"").unwrap(), b"");
        assert_eq!(unescape("é".as_bytes()).unwrap(), "é".as_bytes());
        for bad in ["\\", "\\q", "\\x", "\\x1", "\\xg0", "a\\"] {
            assert!(unescape(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
