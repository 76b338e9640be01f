//! Tokenizer room: the pre-tokenizer split, which cuts the normalized text into the pieces BPE
//! merges.

use super::preset::QWEN3_5;
use regex_automata::util::pool::Pool;
use regex_automata::{meta, Anchored, Input};
use std::panic::{RefUnwindSafe, UnwindSafe};

/// The pre-tokenizer split (HuggingFace's `Split` with `Isolated`: each match is a pre-token,
/// and so is the text between two matches), with the `regex` crate's engine (no look-around, no
/// backtracking). Each search is first anchored where the last pre-token ended, which needs only
/// a forward scan; unanchored only when that finds nothing (a gap).
///
/// A regex ending in `|\s+(?!\S)|\s+` (Qwen, cl100k, o200k style) is split with the
/// `\s+(?!\S)` branch dropped and emulated. That branch, given a whitespace run of two or more
/// characters followed by a non-space, takes all but the last character; with it dropped, `\s+`
/// takes the whole run, so such a match is shortened by one character and the next search
/// starts at the last one, as before. (A backtracking engine such as fancy-regex runs
/// `\s+(?!\S)` on a stack that overflows on a run of about a million spaces; HuggingFace's
/// Oniguruma handles it.) Any other regex must compile as it is.
///
/// Qwen's regex is matched by hand where the text is ASCII ([`qwen_ascii_match`]), and by the
/// regex from the first piece whose match depends on a non-ASCII character: a search of the
/// lazy DFA costs a few hundred instructions to set up, more than a short English word's piece
/// takes by hand (the regex's searches were half of counting an English prompt; see
/// docs/performance.md, "Tokenizer").
pub(super) struct PreTokenSplit {
    regex: meta::Regex,
    /// Search caches, one taken per segment (not per search, as `meta::Regex::search` would).
    caches: Pool<meta::Cache, CacheFn>,
    /// Whether the `\s+(?!\S)` branch is emulated.
    whitespace_tail: bool,
    /// Whether the regex is Qwen's, whose matches over ASCII [`qwen_ascii_match`] finds.
    qwen: bool,
}

type CacheFn = Box<dyn Fn() -> meta::Cache + Send + Sync + UnwindSafe + RefUnwindSafe>;

impl PreTokenSplit {
    const TAIL: &'static str = r"|\s+(?!\S)|\s+";

    pub(super) fn new(pattern: &str) -> Result<PreTokenSplit, String> {
        let qwen = pattern == QWEN3_5.pattern;
        let (pattern, whitespace_tail) = match pattern.strip_suffix(Self::TAIL) {
            Some(head) => (format!(r"{head}|\s+"), true),
            None => (pattern.to_owned(), false),
        };
        let hir = regex_syntax::parse(&pattern).map_err(|e| {
            // The last line of a parse error says what is wrong; the others draw the pattern.
            let error = e.to_string();
            let why = error.lines().last().unwrap_or_default();
            format!(
                "split regex not supported (only a trailing `\\s+(?!\\S)` may look around): {}",
                why.trim_start_matches("error: ")
            )
        })?;
        if hir.properties().minimum_len() == Some(0) {
            return Err("split regex can match the empty string".to_owned());
        }
        let regex = meta::Regex::builder()
            .build_from_hir(&hir)
            .map_err(|e| format!("split regex: {e}"))?;
        let for_caches = regex.clone();
        Ok(PreTokenSplit {
            regex,
            caches: Pool::new(Box::new(move || for_caches.create_cache())),
            whitespace_tail,
            qwen,
        })
    }

    /// The next match at or after `start`.
    fn find(&self, cache: &mut meta::Cache, text: &str, start: usize) -> Option<(usize, usize)> {
        if self.qwen {
            if let Some(end) = qwen_ascii_match(text.as_bytes(), start) {
                return Some((start, end));
            }
        }
        let input = Input::new(text).range(start..).anchored(Anchored::Yes);
        self.regex
            .search_with(cache, &input)
            .or_else(|| self.regex.search_with(cache, &input.anchored(Anchored::No)))
            .map(|m| (m.start(), m.end()))
    }

    pub(super) fn pieces<'t>(&'t self, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
        let mut cache = self.caches.get();
        let mut start = 0;
        // A match found after a gap, returned after the gap.
        let mut next = None;
        std::iter::from_fn(move || {
            if start == text.len() {
                return None;
            }
            let Some((m_start, m_end)) = next.take().or_else(|| self.find(&mut cache, text, start))
            else {
                let rest = &text[start..];
                start = text.len();
                return Some(rest);
            };
            if m_start > start {
                next = Some((m_start, m_end));
                let gap = &text[start..m_start];
                start = m_start;
                return Some(gap);
            }
            let mut end = m_end;
            let piece = &text[m_start..m_end];
            // A `\s+` match: whitespace not ending in a newline (the earlier branches of these
            // regexes never match such text: they need a letter, digit, punctuation or newline).
            if self.whitespace_tail && end < text.len() && piece.chars().all(char::is_whitespace) {
                let mut chars = piece.chars();
                if let (Some(last), Some(_)) = (chars.next_back(), chars.next()) {
                    if last != '\r' && last != '\n' {
                        end -= last.len_utf8();
                    }
                }
            }
            start = end;
            Some(&text[m_start..end])
        })
    }
}

/// The end of the match Qwen's split regex ([`QWEN3_5`]'s pattern, its `\s+(?!\S)` branch left
/// to [`PreTokenSplit::pieces`]) makes anchored at `start`, found without the regex when every
/// character the match depends on is ASCII; `None` when one is not, for the regex to decide.
///
/// Over ASCII the pattern's classes are plain: `\p{L}` the letters, `\p{N}` the digits, no
/// `\p{M}`, `\s` tab, line feed, vertical tab, form feed, carriage return and space; and every
/// ASCII character starts a match of one branch, tried in the pattern's order (the first
/// branch that matches wins, each taking as much as it can):
///
/// 1. `(?i:'s|'t|'re|'ve|'m|'ll|'d)`;
/// 2. `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+`: a run of letters, after one character that is not a
///    line break, letter or digit;
/// 3. `\p{N}`: one digit;
/// 4. ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`: a run of punctuation after an optional space, then
///    line breaks;
/// 5. `\s*[\r\n]+`: whitespace through its last line break;
/// 6. `\s+`: whitespace.
///
/// A run that ends at a non-ASCII character, which might continue it (a letter, a mark, a
/// space such as U+00A0, punctuation), and a branch that would read one, give `None`.
fn qwen_ascii_match(text: &[u8], start: usize) -> Option<usize> {
    let at = |i: usize| text.get(i).copied();
    let c = at(start).filter(u8::is_ascii)?;
    // The end of the run of `class` from `i`, or `None` where a non-ASCII byte ends it.
    let run = |mut i: usize, class: fn(u8) -> bool| {
        while let Some(b) = at(i) {
            if !b.is_ascii() {
                return None;
            }
            if !class(b) {
                break;
            }
            i += 1;
        }
        Some(i)
    };
    // 1. A contraction.
    if c == b'\'' {
        let second = at(start + 1);
        if second.is_some_and(|b| !b.is_ascii()) {
            return None;
        }
        match second.map(|b| b.to_ascii_lowercase()) {
            Some(b's' | b't' | b'm' | b'd') => return Some(start + 2),
            Some(second @ (b'r' | b'v' | b'l')) => {
                let third = if second == b'l' { b'l' } else { b'e' };
                match at(start + 2) {
                    Some(b) if !b.is_ascii() => return None,
                    Some(b) if b.to_ascii_lowercase() == third => return Some(start + 3),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    // 2. Letters, perhaps after one character that is not a line break, letter or digit.
    if is_letter(c) {
        return run(start, is_letter);
    }
    if !matches!(c, b'\r' | b'\n') && !c.is_ascii_digit() {
        match at(start + 1) {
            Some(b) if !b.is_ascii() => return None,
            Some(b) if is_letter(b) => return run(start + 1, is_letter),
            _ => {}
        }
    }
    // 3. A digit.
    if c.is_ascii_digit() {
        return Some(start + 1);
    }
    // 4. Punctuation, perhaps after a space, then line breaks (which no non-ASCII character
    //    continues). What follows a space is ASCII or nothing: branch 2 looked.
    let punctuation = if c == b' ' {
        at(start + 1)
            .filter(|&b| is_punctuation(b))
            .map(|_| start + 1)
    } else if is_punctuation(c) {
        Some(start)
    } else {
        None
    };
    if let Some(from) = punctuation {
        let mut end = run(from, is_punctuation)?;
        while matches!(at(end), Some(b'\r' | b'\n')) {
            end += 1;
        }
        return Some(end);
    }
    // 5-6. Whitespace (all that is left), through its last line break if it has one.
    let end = run(start, is_space)?;
    Some(
        text[start..end]
            .iter()
            .rposition(|b| matches!(b, b'\r' | b'\n'))
            .map_or(end, |last| start + last + 1),
    )
}

/// `\p{L}` over ASCII.
fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

/// `\s` over ASCII (Unicode's White_Space).
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

/// `[^\s\p{L}\p{M}\p{N}]` over ASCII.
fn is_punctuation(b: u8) -> bool {
    !is_space(b) && !b.is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Qwen's split, and the same regex with every match left to the regex.
    fn splits() -> (PreTokenSplit, PreTokenSplit) {
        let ascii = PreTokenSplit::new(QWEN3_5.pattern).unwrap();
        let mut regex = PreTokenSplit::new(QWEN3_5.pattern).unwrap();
        regex.qwen = false;
        (ascii, regex)
    }

    fn pieces<'t>(split: &'t PreTokenSplit, text: &'t str) -> Vec<&'t str> {
        split.pieces(text).collect()
    }

    #[test]
    fn qwens_pattern_is_known_and_no_other() {
        let (ascii, _) = splits();
        assert!(ascii.qwen);
        assert!(!PreTokenSplit::new(r"\p{L}+|\p{N}|\s+").unwrap().qwen);
    }

    #[test]
    fn ascii_is_split_as_the_regex_splits_it() {
        let (ascii, regex) = splits();
        let texts = [
            "Hello, world! It's 2026; they'RE here, we'll see\r\n\r\n  done.",
            "a'b 's 'x 'll 'LL 'vE 're 'r 'l 'v '",
            "  \t x\n\n  y \r\n\t\x0b\x0c z  ",
            "fn main() {\n    println!(\"{}\", 1 + 22);\n}\n",
            "-abc ...def ?! \"quoted\"\n\n\n(x) [1,2] {a:b}",
            "\x00\x1f\x7f~`|\\ \x01a",
            "trailing spaces   ",
            "   ",
            "'",
            "x",
        ];
        for text in texts {
            assert_eq!(pieces(&ascii, text), pieces(&regex, text), "{text:?}");
        }
        assert_eq!(
            pieces(&ascii, "It's  2 apples,\n\n ok"),
            ["It", "'s", " ", " ", "2", " apples", ",\n\n", " ok"]
        );
    }

    #[test]
    fn a_non_ascii_character_a_match_depends_on_leaves_it_to_the_regex() {
        let (ascii, regex) = splits();
        // U+017F folds to `s`, U+00A0 and U+0085 are whitespace, U+0301 is a mark, U+2026
        // punctuation, U+0661 a digit.
        for text in [
            "'\u{17f}",
            "'r\u{e9}",
            "caf\u{e9}",
            "e\u{301}x",
            "a \u{a0}b",
            " \u{85}\n",
            "x\u{2026}",
            "?\u{2026}",
            " \u{4e2d}",
            "-\u{e9}t\u{e9}",
            "1\u{661}",
            "'\u{301}",
        ] {
            assert_eq!(pieces(&ascii, text), pieces(&regex, text), "{text:?}");
        }
    }

    /// Characters where the branches of Qwen's regex differ, ASCII and not.
    fn tricky() -> impl Strategy<Value = String> {
        let chars = prop::sample::select(vec![
            "a", "Z", "s", "S", "t", "r", "e", "E", "v", "l", "L", "m", "d", "'", "0", "7", " ",
            "\t", "\r", "\n", "\x0b", "\x0c", "\x00", "\x1f", "\x7f", ".", "-", "\"", "!", "_",
            "\u{17f}", "\u{e9}", "\u{301}", "\u{a0}", "\u{85}", "\u{2026}", "\u{4e2d}", "\u{661}",
            "\u{3000}", "\u{2028}",
        ]);
        prop::collection::vec(chars, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn any_text_is_split_as_the_regex_splits_it(text in tricky()) {
            let (ascii, regex) = splits();
            prop_assert_eq!(pieces(&ascii, &text), pieces(&regex, &text));
        }
    }
}
