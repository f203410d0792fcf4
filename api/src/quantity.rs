//! Kubernetes resource quantities (`512Mi`, `1G`, `1.5Gi`, `2e9`) as whole bytes.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The quantity in bytes, rounded up; `None` when it is not a quantity or not a whole
/// non-negative number of bytes that fits in 64 bits.
pub fn bytes(quantity: &Quantity) -> Option<u64> {
    let text = quantity.0.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => {
            let exponent: i32 = suffix
                .strip_prefix(['e', 'E'])
                .and_then(|e| e.parse().ok())?;
            10f64.powi(exponent)
        }
    };
    if number.is_empty() || number.matches('.').count() > 1 {
        return None;
    }
    let value = number.parse::<f64>().ok()? * factor;
    // Exact for every quantity up to 2^53 bytes; past that, whole pebibytes are exact still.
    (value.is_finite() && value >= 0.0 && value < 2f64.powi(64)).then(|| value.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(text: &str) -> Option<u64> {
        bytes(&Quantity(text.into()))
    }

    #[test]
    fn quantities_in_bytes() {
        assert_eq!(b("512Mi"), Some(512 << 20));
        assert_eq!(b("1.5Gi"), Some(3 << 29));
        assert_eq!(b("1G"), Some(1_000_000_000));
        assert_eq!(b("2e3"), Some(2000));
        assert_eq!(b("1000"), Some(1000));
        assert_eq!(b("0"), Some(0));
        for bad in ["", "Mi", "1..2Mi", "-1Mi", "1Xi", "12 Mi", "1e", "99999Ei"] {
            assert_eq!(b(bad), None, "{bad}");
        }
    }
}
