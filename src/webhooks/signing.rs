//! Standard Webhooks signatures: the `whsec_` secret and the `v1,`
//! signature of one attempt.
//!
//! delivery loop ──Secret::sign(id, timestamp, body)──▶ `webhook-signature` header
//!
//! The signed content is `"<webhook-id>.<webhook-timestamp>.<body>"`, the
//! signature `v1,` and the base64 (standard alphabet, padded) of its
//! HMAC-SHA256 under the secret's bytes (the base64 after `whsec_`). This
//! is the reference algorithm; `tests/webhooks.rs` checks cadre's headers
//! with the reference library (`standardwebhooks`). Written here with the
//! RustCrypto `hmac` and `sha2` crates rather than that library, whose
//! signing API takes its own types for ids and times and would bring a
//! second `base64` and `time` into the runtime for ten lines.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Shortest and longest secret, in bytes (Standard Webhooks asks for 24
/// to 64; longer ones are accepted, to 128).
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=128;

/// Secrets are read leniently (padding optional, stray low bits kept):
/// what matters is the bytes, which both ends decode alike.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A signing secret (`whsec_<base64>`). Its `Debug` shows no byte of it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// `whsec_` and the base64 of 24 to 128 bytes.
    pub fn parse(text: &str) -> Result<Secret, String> {
        let b64 = text
            .strip_prefix("whsec_")
            .ok_or("a webhook secret starts with 'whsec_'")?;
        let bytes = LENIENT
            .decode(b64)
            .map_err(|_| "after 'whsec_' a webhook secret is base64".to_string())?;
        if !SECRET_BYTES.contains(&bytes.len()) {
            return Err(format!(
                "a webhook secret holds {} to {} bytes (this one {})",
                SECRET_BYTES.start(),
                SECRET_BYTES.end(),
                bytes.len()
            ));
        }
        Ok(Secret(bytes))
    }

    /// The `webhook-signature` header of one attempt.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_vector_signs_alike() {
        // The example of the Standard Webhooks specification.
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_that_are_not_whsec_base64_of_24_to_64_bytes_are_refused() {
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_!!!").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err());
        assert_eq!(
            format!(
                "{:?}",
                Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()
            ),
            "Secret(…)"
        );
    }
}
