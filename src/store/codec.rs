//! How rows lie in redb's pages: the big tables' values zstd-compressed
//! (issue #34, lean storage).
//!
//! writer ──messages · tool_calls · turns rows──▶ [`pack`] ──▶ redb
//! every read of a row ──▶ [`json`] (unpacks when packed) ──▶ serde_json
//!
//! Why: a turn stores its payloads (a tool's arguments and output) in its
//! messages and its call record, and redb keeps a value larger than a page
//! (4 KiB) in a run of pages rounded up to a power of two: a 4.7 KB call
//! record took 8 KB. Compressed, the same record fits a page and shares
//! leaves with others (docs/performance.md, "Storage per turn", has the
//! figures before and after). PostgreSQL compresses its large values
//! itself (TOAST), so the cluster store writes JSON as before.
//!
//! Decided here:
//! - **What is packed**: a value of the `messages`, `tool_calls` and
//!   `turns` tables of at least [`PACK_FROM`] bytes, and only when zstd
//!   makes it smaller. Small rows, indexes and documents stay JSON.
//! - **How a packed value is told apart**: by zstd's own frame magic
//!   (`28 B5 2F FD`): JSON text never starts with `(`. So rows written
//!   before this read as they are, no migration, and a file written by
//!   this build holds both kinds.
//! - **zstd level 1** (its fastest standard level): about 5 µs per 2 KB
//!   on this machine class; level 3 saved a few per cent more for twice
//!   the time. The frame records its content size, so a row's plain
//!   length is known without unpacking ([`plain_len`]): storage quotas go
//!   on counting the JSON bytes, as on PostgreSQL.
//! - The crate: `zstd` (bindings to the reference library, the field's
//!   standard); the pure-Rust LZ4 and deflate crates were the alternatives,
//!   but LZ4 has no entropy coding (text payloads barely shrink) and
//!   deflate is several times slower.

use std::borrow::Cow;

/// Values shorter than this are stored as they are.
pub const PACK_FROM: usize = 512;

/// The zstd level rows are packed at.
const LEVEL: i32 = 1;

/// zstd's frame magic number, as it starts a frame.
const MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The most a packed row may unpack to (a row is bounded far below this:
/// a message by the API's limits, a record by the output caps); a frame
/// claiming more is corrupt.
const MAX_PLAIN: u64 = 256 * 1024 * 1024;

/// `row` (JSON) as it is stored: packed when that pays.
pub fn pack(row: Vec<u8>) -> Vec<u8> {
    if row.len() < PACK_FROM {
        return row;
    }
    match zstd::bulk::compress(&row, LEVEL) {
        Ok(packed) if packed.len() < row.len() => packed,
        _ => row,
    }
}

/// Whether `stored` is a packed row.
pub fn is_packed(stored: &[u8]) -> bool {
    stored.starts_with(&MAGIC)
}

/// The JSON of a stored row.
pub fn unpack(stored: &[u8]) -> Result<Cow<'_, [u8]>, serde_json::Error> {
    if !is_packed(stored) {
        return Ok(Cow::Borrowed(stored));
    }
    let corrupt = |why: String| serde::de::Error::custom(format!("a packed row: {why}"));
    let size = match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) if n <= MAX_PLAIN => n,
        Ok(_) => return Err(corrupt("no or too large a content size".into())),
        Err(e) => return Err(corrupt(format!("{e:?}"))),
    };
    zstd::bulk::decompress(stored, size as usize)
        .map(Cow::Owned)
        .map_err(|e| corrupt(e.to_string()))
}

/// A stored row decoded: what every read of a row goes through.
pub fn json<T: serde::de::DeserializeOwned>(stored: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(&unpack(stored)?)
}

/// The length of a stored row's JSON (what storage quotas count).
pub fn plain_len(stored: &[u8]) -> u64 {
    if !is_packed(stored) {
        return stored.len() as u64;
    }
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) => n,
        _ => stored.len() as u64,
    }
}

/// Every packed row found anywhere in `bytes` (a whole data file, say),
/// unpacked: what a scan of a file for some text must read besides its
/// raw bytes (a test proving a secret was never stored, or was erased).
pub fn frames_in(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(MAGIC.len()).position(|w| w == MAGIC) {
        let start = at + found;
        let rest = &bytes[start..];
        match zstd::zstd_safe::find_frame_compressed_size(rest) {
            Ok(n) if n <= rest.len() => {
                if let Ok(plain) = unpack(&rest[..n]) {
                    out.push(plain.into_owned());
                }
                at = start + n.max(1);
            }
            _ => at = start + 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_row_is_packed_and_reads_back_and_a_small_one_stays_json() {
        let text: String = (0..4000)
            .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
            .collect();
        let row = serde_json::to_vec(&serde_json::json!({"text": text})).unwrap();
        let stored = pack(row.clone());
        assert!(is_packed(&stored));
        assert!(stored.len() < row.len());
        assert_eq!(plain_len(&stored), row.len() as u64);
        assert_eq!(&*unpack(&stored).unwrap(), row.as_slice());
        let back: serde_json::Value = json(&stored).unwrap();
        assert_eq!(back["text"], text.as_str());

        let small = br#"{"a":1}"#.to_vec();
        assert_eq!(pack(small.clone()), small);
        assert_eq!(plain_len(&small), small.len() as u64);
        let v: serde_json::Value = json(&small).unwrap();
        assert_eq!(v["a"], 1);
    }

    #[test]
    fn a_corrupt_frame_is_an_error_not_a_panic() {
        let mut stored = pack(vec![b'x'; 4096]);
        assert!(is_packed(&stored));
        let n = stored.len();
        stored.truncate(n / 2);
        assert!(unpack(&stored).is_err());
        assert!(json::<serde_json::Value>(&MAGIC).is_err());
    }

    #[test]
    fn frames_are_found_in_a_file_among_other_bytes() {
        let secret = "4111 1111 1111 1111 ".repeat(40);
        let mut file = b"raw bytes (".to_vec();
        file.extend(pack(secret.clone().into_bytes()));
        file.extend(b"more raw bytes");
        file.extend(pack(vec![b'y'; 2048]));
        assert!(!file.windows(19).any(|w| w == &secret.as_bytes()[..19]));
        let frames = frames_in(&file);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], secret.as_bytes());
    }
}
