//! Numbers written as decimal digits without `fmt`, on paths that run for every answer.

/// `n` in decimal digits onto `out`, without `fmt`.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}
