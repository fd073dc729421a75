//! Decompression of produced record batches with a bound on the output.
//!
//! The codecs are the ones kafka-protocol uses (flate2, lz4, snap, zstd) and read the
//! same formats, but every stream is read through a budget: a partition's batches may
//! inflate to at most [`KAFKA_BATCH_INFLATED_BYTES_MAX`] bytes together, so a small
//! compressed batch cannot make the broker allocate without limit. Past the budget the
//! batch is refused with [`InflateError::TooLarge`].

use std::cell::Cell;
use std::io::Read;

use bytes::{Buf, Bytes};
use kafka_protocol::records::Compression;

/// Most bytes the record batches of one produced partition may inflate to, all
/// batches together: the request frame limit, so a compressed request carries no more
/// than an uncompressed one could.
pub const KAFKA_BATCH_INFLATED_BYTES_MAX: usize = super::REQUEST_BYTES_MAX as usize;

/// The piece a streaming codec is read in.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The header of a snappy stream in the framing Kafka's Java clients write
/// (snappy-java's `SnappyOutputStream`); without it the batch is one raw block.
/// Magic, version and compatible version, as kafka-protocol compares them.
const SNAPPY_JAVA_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

/// Why a batch's records could not be inflated.
#[derive(Debug, thiserror::Error)]
pub enum InflateError {
    /// The records inflate past what is left of the budget.
    #[error("compressed records inflate past {limit} bytes (KAFKA_BATCH_INFLATED_BYTES_MAX)")]
    TooLarge { limit: usize },
    /// The compressed bytes are not a valid stream of their codec.
    #[error("{codec} records do not decompress: {reason}")]
    Corrupt { codec: &'static str, reason: String },
}

/// A decompression budget shared by the batches of one partition.
pub(crate) struct Inflater {
    limit: usize,
    left: Cell<usize>,
}

impl Inflater {
    pub(crate) fn new(limit: usize) -> Self {
        Inflater {
            limit,
            left: Cell::new(limit),
        }
    }

    fn too_large(&self) -> InflateError {
        InflateError::TooLarge { limit: self.limit }
    }

    /// Takes `n` bytes from the budget, or refuses.
    fn spend(&self, n: usize) -> Result<(), InflateError> {
        let left = self.left.get();
        if n > left {
            return Err(self.too_large());
        }
        self.left.set(left - n);
        Ok(())
    }

    /// Reads `r` to its end, at most what is left of the budget. The output grows by
    /// doubling but never past the budget, so room is never made for refused bytes.
    fn read_all(&self, codec: &'static str, mut r: impl Read) -> Result<Bytes, InflateError> {
        let left = self.left.get();
        let mut out: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        loop {
            let n = match r.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(InflateError::Corrupt {
                        codec,
                        reason: e.to_string(),
                    })
                }
            };
            if n > left - out.len() {
                return Err(self.too_large());
            }
            if out.capacity() - out.len() < n {
                let want = (out.capacity() * 2).max(out.len() + n).min(left);
                out.reserve_exact(want - out.len());
            }
            out.extend_from_slice(&chunk[..n]);
        }
        self.spend(out.len())?;
        Ok(out.into())
    }

    /// One snappy block, its claimed length checked before room is made for it.
    fn snappy_block(&self, block: &[u8], out: &mut Vec<u8>) -> Result<(), InflateError> {
        let corrupt = |e: snap::Error| InflateError::Corrupt {
            codec: "snappy",
            reason: e.to_string(),
        };
        let len = snap::raw::decompress_len(block).map_err(corrupt)?;
        self.spend(len)?;
        let start = out.len();
        out.resize(start + len, 0);
        let n = snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(corrupt)?;
        out.truncate(start + n);
        Ok(())
    }

    fn snappy(&self, mut src: Bytes) -> Result<Bytes, InflateError> {
        let mut out = Vec::new();
        if !src.starts_with(SNAPPY_JAVA_HEADER) {
            self.snappy_block(&src, &mut out)?;
            return Ok(out.into());
        }
        src.advance(SNAPPY_JAVA_HEADER.len());
        while src.has_remaining() {
            let block = (src.len() >= 4)
                .then(|| src.get_u32() as usize)
                .filter(|n| *n <= src.len())
                .ok_or_else(|| InflateError::Corrupt {
                    codec: "snappy",
                    reason: "a block is cut short".into(),
                })?;
            self.snappy_block(&src.split_to(block), &mut out)?;
        }
        Ok(out.into())
    }

    /// Inflates one batch's records.
    pub(crate) fn inflate(&self, src: Bytes, c: Compression) -> Result<Bytes, InflateError> {
        let io = |codec: &'static str| {
            move |e: std::io::Error| InflateError::Corrupt {
                codec,
                reason: e.to_string(),
            }
        };
        match c {
            Compression::None => {
                self.spend(src.len())?;
                Ok(src)
            }
            Compression::Gzip => self.read_all("gzip", flate2::read::GzDecoder::new(src.reader())),
            Compression::Snappy => self.snappy(src),
            Compression::Lz4 => {
                let d = lz4::Decoder::new(src.reader()).map_err(io("lz4"))?;
                self.read_all("lz4", d)
            }
            Compression::Zstd => {
                let d = zstd::stream::read::Decoder::new(src.reader()).map_err(io("zstd"))?;
                self.read_all("zstd", d)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap().into()
    }

    #[test]
    fn every_codec_round_trips_under_the_budget() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let inf = Inflater::new(1 << 20);
        assert_eq!(
            &inf.inflate(gzip(&data), Compression::Gzip).unwrap()[..],
            &data[..]
        );
        let z = zstd::stream::encode_all(&data[..], 3).unwrap();
        assert_eq!(
            &inf.inflate(z.into(), Compression::Zstd).unwrap()[..],
            &data[..]
        );
        let mut l = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        l.write_all(&data).unwrap();
        let (l, r) = l.finish();
        r.unwrap();
        assert_eq!(
            &inf.inflate(l.into(), Compression::Lz4).unwrap()[..],
            &data[..]
        );
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(
            &inf.inflate(raw.clone().into(), Compression::Snappy)
                .unwrap()[..],
            &data[..]
        );
        // snappy-java framing: header, then length-prefixed raw blocks.
        let mut framed = SNAPPY_JAVA_HEADER.to_vec();
        for _ in 0..2 {
            framed.extend_from_slice(&u32::try_from(raw.len()).unwrap().to_be_bytes());
            framed.extend_from_slice(&raw);
        }
        let out = inf.inflate(framed.into(), Compression::Snappy).unwrap();
        assert_eq!(out.len(), 2 * data.len());
        assert_eq!(&out[data.len()..], &data[..]);
        // Six times 100 000 bytes came out, all of it taken from the budget.
        assert_eq!(inf.left.get(), (1 << 20) - 600_000);
    }

    #[test]
    fn a_gzip_bomb_is_refused_at_the_budget() {
        let bomb = gzip(&vec![0u8; 8 << 20]);
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let inf = Inflater::new(1 << 20);
        let e = inf.inflate(bomb, Compression::Gzip).unwrap_err();
        assert!(
            matches!(e, InflateError::TooLarge { limit } if limit == 1 << 20),
            "{e}"
        );
    }

    #[test]
    fn the_budget_is_shared_by_the_batches() {
        let inf = Inflater::new(150_000);
        let one = gzip(&[7u8; 100_000]);
        assert_eq!(
            inf.inflate(one.clone(), Compression::Gzip).unwrap().len(),
            100_000
        );
        assert!(matches!(
            inf.inflate(one, Compression::Gzip),
            Err(InflateError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_snappy_block_claiming_more_than_the_budget_is_refused_before_allocating() {
        // A raw block whose varint length prefix claims 0xFFFF_FFFF bytes.
        let claim = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        let inf = Inflater::new(1 << 20);
        assert!(matches!(
            inf.inflate(claim, Compression::Snappy),
            Err(InflateError::TooLarge { .. } | InflateError::Corrupt { .. })
        ));
        let cut = Bytes::from_static(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x10");
        assert!(matches!(
            inf.inflate(cut, Compression::Snappy),
            Err(InflateError::Corrupt { .. })
        ));
        assert!(matches!(
            inf.inflate(Bytes::from_static(b"not gzip"), Compression::Gzip),
            Err(InflateError::Corrupt { .. })
        ));
    }
}
