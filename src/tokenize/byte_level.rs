//! Tokenizer room: the GPT-2 byte-to-unicode alphabet that byte-level BPE vocabularies
//! (HuggingFace `ByteLevel`) use to spell raw bytes as printable characters.

/// The character that spells `byte` in a byte-level vocabulary.
pub fn byte_to_char(byte: u8) -> char {
    CHAR_OF_BYTE[byte as usize]
}

/// Byte-level spelling of a byte string.
pub fn bytes_to_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// The bytes a byte-level string spells, or `None` if it contains a character outside the
/// 256-character alphabet.
pub fn string_to_bytes(s: &str) -> Option<Vec<u8>> {
    s.chars()
        .map(|c| BYTE_OF_CODE.get(c as usize).copied().flatten())
        .collect()
}

const fn printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Printable bytes spell themselves; the others take U+0100 upwards, in byte order.
const CHAR_OF_BYTE: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next = 0x100;
    let mut b = 0;
    while b < 256 {
        table[b] = if printable(b as u8) {
            b as u8 as char
        } else {
            next += 1;
            match char::from_u32(next - 1) {
                Some(c) => c,
                None => panic!("U+0100..U+0143 are chars"),
            }
        };
        b += 1;
    }
    table
};

/// Inverse of [`CHAR_OF_BYTE`]: every alphabet character lies below U+0144.
const BYTE_OF_CODE: [Option<u8>; 0x144] = {
    let mut table = [None; 0x144];
    let mut b = 0;
    while b < 256 {
        table[CHAR_OF_BYTE[b] as usize] = Some(b as u8);
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gpt2_spellings() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        assert_eq!(byte_to_char(0xFF), 'ÿ');
        assert_eq!(bytes_to_string("é ".as_bytes()), "Ã©Ġ");
    }

    #[test]
    fn alphabet_is_a_bijection() {
        let all: Vec<u8> = (0..=255).collect();
        let s = bytes_to_string(&all);
        assert_eq!(
            s.chars().collect::<std::collections::HashSet<_>>().len(),
            256
        );
        assert_eq!(string_to_bytes(&s).unwrap(), all);
        assert_eq!(string_to_bytes("a\u{144}"), None);
        assert_eq!(string_to_bytes(" "), None);
    }
}
