//! Tokenizer room: byte-level BPE over a merge list, applied exactly as HuggingFace
//! `tokenizers` applies it: the adjacent pair with the lowest merge rank merges first, the
//! leftmost on ties, until no pair has a merge; a pre-token that is a whole vocabulary token
//! stays one token (`ignore_merges`).
//!
//! The tables are flat and keyed by integers: a pair of ids packed in a `u64` maps to its merge,
//! and token bytes live in one buffer. A short pre-token (a word, or a Chinese clause of a few
//! dozen bytes) is merged by scanning its pairs for the lowest rank, which on such lengths beats
//! a heap; a long one (a run of letters with no break, a base64 blob) goes through a heap, so no
//! input costs more than `O(n log n)`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

/// Pre-tokens of up to this many initial symbols merge by scanning; longer ones through a heap.
const SCAN_MAX: usize = 128;

/// Marks "no neighbour" in the heap path's links.
const NONE: u32 = u32::MAX;

/// A merge of an adjacent pair: its priority and the token it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Merge {
    /// Index in the merge list: lower merges first.
    rank: u32,
    /// Id of the merged token.
    merged: u32,
}

impl Merge {
    /// The pair has no merge.
    const NONE: Merge = Merge {
        rank: u32::MAX,
        merged: u32::MAX,
    };
}

/// Byte-level BPE: a vocabulary of byte strings (ids dense from 0) and a merge list.
pub(super) struct Bpe {
    /// Bytes of every token, concatenated: token `id` is `bytes[starts[id]..starts[id + 1]]`.
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// Id of each single byte.
    byte_ids: [u32; 256],
    /// Merge of each pair `(left << 32) | right`.
    merges: FxHashMap<u64, Merge>,
    /// Ids, hashed by their bytes.
    ids: HashTable<u32>,
    /// Token of each BMP character that BPE may start from whole, else `NONE`.
    char_ids: Vec<u32>,
}

/// Reusable buffers for [`Bpe::encode_piece`], so that encoding allocates once per text.
#[derive(Default)]
pub(super) struct Work {
    ids: Vec<u32>,
    pairs: Vec<Merge>,
    next: Vec<u32>,
    prev: Vec<u32>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut hasher = FxBuildHasher.build_hasher();
    hasher.write(bytes);
    hasher.finish()
}

impl Bpe {
    /// The BPE of `tokens` (indexed by id) and `merges` (pairs of token bytes, in priority
    /// order), or why it cannot be built: repeated tokens, a byte without a token, a merge of
    /// tokens outside the vocabulary or one that makes none, or an error `merges` yields.
    pub(super) fn new<T: AsRef<[u8]>, M: AsRef<[u8]>>(
        tokens: &[T],
        merges: impl IntoIterator<Item = Result<(M, M), String>>,
    ) -> Result<Bpe, String> {
        let total: usize = tokens.iter().map(|t| t.as_ref().len()).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut starts = Vec::with_capacity(tokens.len() + 1);
        starts.push(0);
        for token in tokens {
            bytes.extend_from_slice(token.as_ref());
            starts.push(u32::try_from(bytes.len()).map_err(|_| "vocabulary over 4 GB")?);
        }
        let token =
            |id: u32| &bytes[starts[id as usize] as usize..starts[id as usize + 1] as usize];
        let mut ids = HashTable::with_capacity(tokens.len());
        for id in 0..tokens.len() as u32 {
            let hash = hash_bytes(token(id));
            if ids.find(hash, |&other| token(other) == token(id)).is_some() {
                return Err(format!("token {id} repeats an earlier token's bytes"));
            }
            ids.insert_unique(hash, id, |&other| hash_bytes(token(other)));
        }
        let mut bpe = Bpe {
            bytes,
            starts,
            byte_ids: [0; 256],
            merges: FxHashMap::default(),
            ids,
            char_ids: Vec::new(),
        };
        for byte in 0..=255u8 {
            bpe.byte_ids[byte as usize] = bpe
                .token_id(&[byte])
                .ok_or_else(|| format!("byte 0x{byte:02x} has no token"))?;
        }
        let merges = merges.into_iter();
        bpe.merges.reserve(merges.size_hint().0);
        let mut joined = Vec::new();
        let mut lowest_rank_as_half = vec![u32::MAX; bpe.len()];
        for (rank, merge) in merges.enumerate() {
            let (l, r) = merge?;
            let (l, r) = (l.as_ref(), r.as_ref());
            let (Some(left), Some(right)) = (bpe.token_id(l), bpe.token_id(r)) else {
                return Err(format!("merge {rank} names a token outside the vocabulary"));
            };
            joined.clear();
            joined.extend_from_slice(l);
            joined.extend_from_slice(r);
            let merged = bpe
                .token_id(&joined)
                .ok_or_else(|| format!("merge {rank} makes no token of the vocabulary"))?;
            // As HuggingFace (which collects the list into a map): a pair listed twice takes
            // its last rank. The lowest rank as a half then counts a rank the pair lost, which
            // only makes `hoistable_characters` more careful.
            let merge = Merge {
                rank: rank as u32,
                merged,
            };
            bpe.merges.insert(pair_key(left, right), merge);
            for half in [left, right] {
                let lowest = &mut lowest_rank_as_half[half as usize];
                *lowest = (*lowest).min(rank as u32);
            }
        }
        bpe.char_ids = hoistable_characters(&bpe, &lowest_rank_as_half);
        Ok(bpe)
    }

    /// Number of tokens.
    pub(super) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Bytes of the longest token.
    pub(super) fn longest_token(&self) -> usize {
        self.starts
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Bytes of token `id` (which must be below [`Bpe::len`]).
    pub(super) fn token_bytes(&self, id: u32) -> &[u8] {
        let id = id as usize;
        &self.bytes[self.starts[id] as usize..self.starts[id + 1] as usize]
    }

    /// Id of the token spelled by `bytes`.
    pub(super) fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.ids
            .find(hash_bytes(bytes), |&id| self.token_bytes(id) == bytes)
            .copied()
    }

    /// Number of characters that start whole.
    #[cfg(test)]
    pub(super) fn whole_characters(&self) -> usize {
        self.char_ids.iter().filter(|&&id| id != NONE).count()
    }

    fn merge_of(&self, left: u32, right: u32) -> Merge {
        self.merges
            .get(&pair_key(left, right))
            .copied()
            .unwrap_or(Merge::NONE)
    }

    /// Encodes one pre-token, handing its ids to `sink`.
    pub(super) fn encode_piece(&self, piece: &str, work: &mut Work, sink: &mut impl FnMut(&[u32])) {
        match piece.as_bytes() {
            [] => {}
            [byte] => sink(&[self.byte_ids[*byte as usize]]),
            bytes => match self.token_id(bytes) {
                Some(id) => sink(&[id]),
                None => {
                    self.initial_symbols(piece, &mut work.ids);
                    sink(self.merge(work));
                }
            },
        }
    }

    /// The symbols BPE starts from: a byte each, except that a character listed in
    /// `char_ids` starts as its token. That is exact (the same merges follow as from its
    /// bytes) because its bytes merge only among themselves, and into that token, before any
    /// merge that touches it could (see [`hoistable_characters`]); a CJK clause starts from
    /// a third of the symbols.
    fn initial_symbols(&self, piece: &str, ids: &mut Vec<u32>) {
        ids.clear();
        for c in piece.chars() {
            match self.char_ids.get(c as usize) {
                Some(&id) if id != NONE => ids.push(id),
                _ => {
                    let mut utf8 = [0; 4];
                    let bytes = c.encode_utf8(&mut utf8).as_bytes();
                    ids.extend(bytes.iter().map(|&b| self.byte_ids[b as usize]));
                }
            }
        }
    }

    /// Merges `work.ids` in place and returns them.
    fn merge<'w>(&self, work: &'w mut Work) -> &'w [u32] {
        if work.ids.len() <= SCAN_MAX {
            self.merge_by_scan(&mut work.ids, &mut work.pairs);
        } else {
            self.merge_by_heap(work);
        }
        &work.ids
    }

    /// Merges `ids` by finding the lowest-ranked pair with a linear scan after every merge.
    /// Returns the highest rank merged (0 if none).
    fn merge_by_scan(&self, ids: &mut Vec<u32>, pairs: &mut Vec<Merge>) -> u32 {
        pairs.clear();
        pairs.extend(ids.windows(2).map(|w| self.merge_of(w[0], w[1])));
        let mut highest = 0;
        loop {
            // Leftmost lowest rank (`pairs[i]` merges `ids[i]` and `ids[i + 1]`).
            let mut best = 0;
            let mut best_rank = u32::MAX;
            for (i, pair) in pairs.iter().enumerate() {
                if pair.rank < best_rank {
                    best_rank = pair.rank;
                    best = i;
                }
            }
            if best_rank == u32::MAX {
                return highest;
            }
            highest = highest.max(best_rank);
            ids[best] = pairs[best].merged;
            ids.remove(best + 1);
            pairs.remove(best);
            if best > 0 {
                pairs[best - 1] = self.merge_of(ids[best - 1], ids[best]);
            }
            if best < pairs.len() {
                pairs[best] = self.merge_of(ids[best], ids[best + 1]);
            }
        }
    }

    /// Merges `work.ids` in place through a min-heap of `(rank, position)`, as HuggingFace
    /// does; a popped entry whose pair has changed since it was pushed is skipped.
    fn merge_by_heap(&self, work: &mut Work) {
        let Work {
            ids,
            next,
            prev,
            heap,
            ..
        } = work;
        let n = ids.len() as u32;
        next.clear();
        next.extend((1..=n).map(|i| if i == n { NONE } else { i }));
        prev.clear();
        prev.extend((0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)));
        heap.clear();
        for i in 0..n.saturating_sub(1) {
            let merge = self.merge_of(ids[i as usize], ids[i as usize + 1]);
            if merge != Merge::NONE {
                heap.push(Reverse((merge.rank, i)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let right = next[pos as usize];
            // Now last, or merged into its left neighbour (which cut its links).
            if right == NONE {
                continue;
            }
            let merge = self.merge_of(ids[pos as usize], ids[right as usize]);
            if merge.rank != rank {
                continue;
            }
            ids[pos as usize] = merge.merged;
            let after = next[right as usize];
            next[pos as usize] = after;
            // `right` is gone: no live symbol links to it, and it links to nothing.
            next[right as usize] = NONE;
            prev[right as usize] = NONE;
            if after != NONE {
                prev[after as usize] = pos;
                let m = self.merge_of(merge.merged, ids[after as usize]);
                if m != Merge::NONE {
                    heap.push(Reverse((m.rank, pos)));
                }
            }
            let before = prev[pos as usize];
            if before != NONE {
                let m = self.merge_of(ids[before as usize], merge.merged);
                if m != Merge::NONE {
                    heap.push(Reverse((m.rank, before)));
                }
            }
        }
        // Compact the live symbols (a chain from position 0) to the front.
        let mut len = 0;
        let mut at = 0;
        while at != NONE && n > 0 {
            ids[len] = ids[at as usize];
            len += 1;
            at = next[at as usize];
        }
        ids.truncate(len);
    }
}

/// The token of every character of the Basic Multilingual Plane that BPE may start from
/// whole (`NONE` for the others), for [`Bpe::initial_symbols`].
///
/// Starting a character `c` from its token `T` instead of its bytes changes nothing when:
/// 1. no token that can occur in UTF-8 text spans a character boundary while holding only
///    part of `c` (a *crossing* token, such as the last byte of one character and the first
///    of the next). Then no pair of symbols that includes part of `c` and something outside it
///    has a merge, so `c`'s bytes merge only among themselves, in the same order as alone;
/// 2. alone, `c`'s bytes merge into exactly `T`, the highest rank used being `R`;
/// 3. every merge that has `T` as a half ranks above `R`.
///
/// While `c` is incomplete, one of its own pairs (rank at most `R`) is always pending, so
/// every merge BPE makes before `c` completes ranks at most `R`. Having `T` from the start
/// only adds pairs with `T`, which rank above `R` (3.) and so are not chosen before `c` would
/// have completed anyway; the merges chosen, and so the result, are the same.
fn hoistable_characters(bpe: &Bpe, lowest_rank_as_half: &[u32]) -> Vec<u32> {
    let mut heads: FxHashSet<&[u8]> = FxHashSet::default();
    let mut tails: FxHashSet<&[u8]> = FxHashSet::default();
    for id in 0..bpe.len() as u32 {
        let bytes = bpe.token_bytes(id);
        if let Some((head, tail)) = partial_ends(bytes) {
            if head > 0 && head < bytes.len() {
                heads.insert(&bytes[..head]);
            }
            if tail > 0 && tail < bytes.len() {
                tails.insert(&bytes[bytes.len() - tail..]);
            }
        }
    }
    let mut char_ids = vec![NONE; 0x10000];
    let mut ids = Vec::new();
    let mut pairs = Vec::new();
    for id in 0..bpe.len() as u32 {
        let bytes = bpe.token_bytes(id);
        let Ok(text) = std::str::from_utf8(bytes) else {
            continue;
        };
        let mut chars = text.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            continue;
        };
        if c.is_ascii() || c as usize >= char_ids.len() {
            continue;
        }
        let crossed =
            (1..bytes.len()).any(|i| heads.contains(&bytes[i..]) || tails.contains(&bytes[..i]));
        if crossed {
            continue;
        }
        ids.clear();
        ids.extend(bytes.iter().map(|&b| bpe.byte_ids[b as usize]));
        let highest = bpe.merge_by_scan(&mut ids, &mut pairs);
        if ids == [id] && lowest_rank_as_half[id as usize] > highest {
            char_ids[c as usize] = id;
        }
    }
    char_ids
}

/// Where `bytes` cut UTF-8 characters: the number of continuation bytes it starts with (the
/// end of a character) and the length of the incomplete character it ends with (the start of
/// one); `None` if no UTF-8 text contains `bytes`.
fn partial_ends(bytes: &[u8]) -> Option<(usize, usize)> {
    let is_continuation = |b: &u8| (0x80..0xC0).contains(b);
    let head = bytes.iter().take_while(|b| is_continuation(b)).count();
    if head > 3 {
        return None;
    }
    let mut at = head;
    while at < bytes.len() {
        let width = match bytes[at] {
            0x00..=0x7F => 1,
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return None,
        };
        let present = 1 + bytes[at + 1..]
            .iter()
            .take(width - 1)
            .take_while(|b| is_continuation(b))
            .count();
        if present < width {
            // Incomplete: only at the very end.
            return (at + present == bytes.len()).then_some((head, present));
        }
        at += width;
    }
    Some((head, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::import::derive_merges;
    use proptest::prelude::*;

    /// All 256 bytes, then merged tokens in rank order (ids 256..).
    fn vocab(extra: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.extend(extra.iter().map(|t| t.to_vec()));
        tokens
    }

    /// The BPE of `extra` with every split of each token as a merge (as `tokenizer import`).
    fn bpe(extra: &[&[u8]]) -> Bpe {
        let tokens = vocab(extra);
        let merges = derive_merges(&tokens)
            .into_iter()
            .map(|(l, r)| Ok((tokens[l as usize].as_slice(), tokens[r as usize].as_slice())));
        Bpe::new(&tokens, merges).unwrap()
    }

    fn spell(bpe: &Bpe, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| String::from_utf8_lossy(bpe.token_bytes(id)).into_owned())
            .collect()
    }

    fn encode(bpe: &Bpe, piece: &str) -> Vec<String> {
        let mut out = Vec::new();
        bpe.encode_piece(piece, &mut Work::default(), &mut |ids| {
            out.extend_from_slice(ids)
        });
        spell(bpe, &out)
    }

    /// A merge list as `Bpe::new` takes it.
    type Merges = Vec<Result<(&'static [u8], &'static [u8]), String>>;

    /// `piece` merged from its bytes (no character starts whole), by scan or by heap.
    fn from_bytes(bpe: &Bpe, piece: &str, heap: bool) -> Vec<u32> {
        let mut work = Work::default();
        work.ids
            .extend(piece.bytes().map(|b| bpe.byte_ids[b as usize]));
        if heap {
            bpe.merge_by_heap(&mut work);
        } else {
            bpe.merge_by_scan(&mut work.ids, &mut work.pairs);
        }
        work.ids
    }

    /// `piece` merged from its initial symbols (hoistable characters whole).
    fn from_symbols(bpe: &Bpe, piece: &str) -> Vec<u32> {
        let mut work = Work::default();
        bpe.initial_symbols(piece, &mut work.ids);
        bpe.merge(&mut work).to_vec()
    }

    /// A vocabulary whose merges compete: overlapping pairs, ties between equal pairs, and a
    /// token that no merge reaches ("xyz": neither "xy" nor "yz" is a token).
    const COMPETING: &[&[u8]] = &[
        b"ab", b"bc", b"aa", b"abc", b"cab", b"aab", b"ca", b"aaaa", b"bca", b"abab", b"xyz",
    ];

    #[test]
    fn lowest_rank_merges_first_and_leftmost_on_ties() {
        let bpe = bpe(COMPETING);
        // "ab" (ranked first) beats "bc"; then ab + c makes "abc".
        assert_eq!(encode(&bpe, "abcx"), ["abc", "x"]);
        // "ab" first, then a + a (ranked before a + ab).
        assert_eq!(encode(&bpe, "aaab"), ["aa", "ab"]);
        // Equal pairs merge leftmost first: aa a a a, aa aa a, aaaa a (rightmost first would
        // give a aaaa).
        assert_eq!(encode(&bpe, "aaaaa"), ["aaaa", "a"]);
        // No merge makes "xyz" ...
        assert_eq!(encode(&bpe, "xyzq"), ["x", "y", "z", "q"]);
        // ... yet a pre-token that is exactly a token stays whole (`ignore_merges`).
        assert_eq!(encode(&bpe, "xyz"), ["xyz"]);
        assert_eq!(encode(&bpe, "z"), ["z"]);
        assert_eq!(encode(&bpe, ""), Vec::<String>::new());
    }

    #[test]
    fn heap_path_handles_long_pieces_like_the_scan() {
        let bpe = bpe(COMPETING);
        let piece = "ab".repeat(SCAN_MAX);
        let heap = from_bytes(&bpe, &piece, true);
        assert_eq!(heap.len(), SCAN_MAX / 2);
        assert!(spell(&bpe, &heap).iter().all(|t| t == "abab"));
        assert_eq!(from_bytes(&bpe, &piece, false), heap);
        // Through `encode_piece` (over SCAN_MAX bytes: the heap path).
        assert_eq!(encode(&bpe, &piece).len(), SCAN_MAX / 2);
    }

    /// "é" = C3 A9, "ü" = C3 BC, "中" = E4 B8 AD.
    const ACCENTS: &[&[u8]] = &[
        "é".as_bytes(),    // 256: starts whole
        b"\xe4\xb8",       // 257: part of 中
        b"\xadz",          // 258: crosses out of 中's last byte, before 中 forms
        "中".as_bytes(),   // 259: does not start whole (crossed)
        "aü".as_bytes(),   // 260: ranks below "ü", which it has as a half
        b"xa",             // 261
        "ü".as_bytes(),    // 262: does not start whole (rank)
        "é中".as_bytes(),  // 263
        "中中".as_bytes(), // 264
    ];

    #[test]
    fn characters_start_whole_only_when_that_changes_nothing() {
        let bpe = bpe(ACCENTS);
        let whole = |c: char| bpe.char_ids[c as usize];
        assert_eq!(whole('é'), 256);
        assert_eq!(whole('中'), NONE);
        assert_eq!(whole('ü'), NONE);
        // Had ü started whole, a + ü (ranked first) would beat x + a.
        assert_eq!(encode(&bpe, "xaüb"), ["xa", "ü", "b"]);
        // Had 中 started whole, 中 + 中 would form; the crossing "\xadz" merges first.
        assert_eq!(encode(&bpe, "中中z"), ["中", "\u{fffd}", "\u{fffd}z"]);
        let uncrossed = self::bpe(&[ACCENTS[..2].to_vec(), ACCENTS[3..].to_vec()].concat());
        assert_eq!(uncrossed.char_ids['中' as usize], 258);
        assert_eq!(encode(&uncrossed, "中中z"), ["中中", "z"]);
        assert_eq!(encode(&bpe, "é中a"), ["é中", "a"]);
        for piece in ["xaüb", "中中z", "é中a", "éxéé中"] {
            assert_eq!(
                from_symbols(&bpe, piece),
                from_bytes(&bpe, piece, false),
                "{piece}"
            );
            let (whole, bytes) = (
                from_symbols(&uncrossed, piece),
                from_bytes(&uncrossed, piece, false),
            );
            assert_eq!(whole, bytes, "{piece}");
        }
    }

    #[test]
    fn partial_ends_find_where_tokens_cut_characters() {
        assert_eq!(partial_ends(b"abc"), Some((0, 0)));
        assert_eq!(partial_ends("中".as_bytes()), Some((0, 0)));
        assert_eq!(partial_ends(b"\xb8\xad"), Some((2, 0)));
        assert_eq!(partial_ends(b"\xe4\xb8"), Some((0, 2)));
        assert_eq!(partial_ends(b"\xadx\xe4"), Some((1, 1)));
        assert_eq!(partial_ends(b"\xf0\x9f\x98"), Some((0, 3)));
        // Nothing UTF-8 holds these: a byte never used, a cut inside, four continuations.
        assert_eq!(partial_ends(b"\xff"), None);
        assert_eq!(partial_ends(b"\xe4x"), None);
        assert_eq!(partial_ends(b"\x80\x80\x80\x80"), None);
    }

    #[test]
    fn a_pair_listed_twice_takes_its_last_rank() {
        let tokens = vocab(&[b"ab", b"bc"]);
        let merges: Merges = vec![Ok((b"a", b"b")), Ok((b"b", b"c")), Ok((b"a", b"b"))];
        let bpe = Bpe::new(&tokens, merges).unwrap();
        // b + c (rank 1) before a + b (rank 2, not 0).
        assert_eq!(encode(&bpe, "abc"), ["a", "bc"]);
    }

    #[test]
    fn refuses_what_it_cannot_represent() {
        let mut no_byte = vocab(&[b"ab"]);
        no_byte.remove(0x7f);
        assert_eq!(
            Bpe::new(&no_byte, Merges::new()).err().unwrap(),
            "byte 0x7f has no token"
        );
        let tokens = vocab(&[b"ab"]);
        let cases: [(Merges, &str); 3] = [
            (
                vec![Ok((b"a", b"b")), Ok((b"b", b"a"))],
                "merge 1 makes no token of the vocabulary",
            ),
            (
                vec![Ok((b"a", b"abc"))],
                "merge 0 names a token outside the vocabulary",
            ),
            (vec![Err("unreadable".to_owned())], "unreadable"),
        ];
        for (merges, expected) in cases {
            assert_eq!(Bpe::new(&tokens, merges).err().unwrap(), expected);
        }
        let mut repeated = vocab(&[b"ab"]);
        repeated.push(b"ab".to_vec());
        assert_eq!(
            Bpe::new(&repeated, Merges::new()).err().unwrap(),
            "token 257 repeats an earlier token's bytes"
        );
    }

    #[test]
    fn token_ids_and_bytes_round_trip() {
        let bpe = bpe(COMPETING);
        assert_eq!(bpe.len(), 256 + COMPETING.len());
        assert_eq!(bpe.token_id(b"abab"), Some(265));
        assert_eq!(bpe.token_bytes(265), b"abab");
        assert_eq!(bpe.token_bytes(266), b"xyz");
        assert_eq!(bpe.token_id(b"abcd"), None);
        assert_eq!(bpe.token_id(&[0xff]), Some(255));
    }

    proptest! {
        /// Scan and heap agree, and the result spells the input, on strings over a small
        /// alphabet (every length up to past `SCAN_MAX`).
        #[test]
        fn scan_and_heap_agree(piece in "[abcxyz]{2,200}") {
            let bpe = bpe(COMPETING);
            let scan = from_bytes(&bpe, &piece, false);
            prop_assert_eq!(&scan, &from_bytes(&bpe, &piece, true));
            prop_assert_eq!(spell(&bpe, &scan).concat(), piece);
        }

        /// Starting characters whole gives what merging their bytes gives.
        #[test]
        fn whole_characters_merge_like_their_bytes(piece in "[axzéü中]{1,150}") {
            let bpe = bpe(ACCENTS);
            prop_assert_eq!(from_symbols(&bpe, &piece), from_bytes(&bpe, &piece, false));
        }
    }
}
