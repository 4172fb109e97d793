//! What went wrong in the store, in the words of the fix.
//!
//! `object_store` has already retried what can pass by itself (timeouts, 5xx, dropped
//! connections) when an error reaches us, so what is left is permanent, and the user needs
//! to know which kind it is: a bucket that does not exist, credentials the store refuses, an
//! endpoint nobody answers at, or something else. `object_store` reports most of these as
//! `Generic` errors (a failed list is never `NotFound`), so the S3 error code in the body
//! (`<Code>NoSuchBucket</Code>`, stable across AWS, MinIO, Ceph and SeaweedFS) and the
//! transport error kind are read from the error's chain instead.

use std::error::Error as StdError;

use object_store::client::{HttpError, HttpErrorKind};

use super::url::StoreUrl;
use crate::Error;

/// The kinds of permanent store failure, each with its own fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The bucket does not exist.
    NoSuchBucket,
    /// The multipart upload being written is gone: aborted by someone else, or its bucket
    /// deleted (stores answer `NoSuchUpload` then, not `NoSuchBucket`).
    UploadGone,
    /// The credentials are unknown, wrong or not allowed: the store's code.
    Denied(String),
    /// Nothing answers at the endpoint: what the connection said.
    Unreachable(String),
    /// Anything else.
    Other,
}

/// The S3 error codes that mean "these credentials may not do this".
const DENIED: [&str; 7] = [
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "AccountProblem",
];

/// Classifies a failed request from its error chain.
pub fn classify(error: &object_store::Error) -> Problem {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(http) = e.downcast_ref::<HttpError>() {
            if http.kind() == HttpErrorKind::Connect {
                return Problem::Unreachable(innermost(http));
            }
        }
        current = e.source();
    }
    let denied_variant = matches!(
        error,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    );
    classify_text(&chain_text(error), denied_variant)
}

/// Classifies by the S3 error code in `text` (an error chain's messages), or by its HTTP status.
pub fn classify_text(text: &str, denied_variant: bool) -> Problem {
    let code =
        text.split_once("<Code>").and_then(|(_, rest)| rest.split_once("</Code>")).map(|(code, _)| code);
    match code {
        Some("NoSuchBucket") => Problem::NoSuchBucket,
        Some("NoSuchUpload") => Problem::UploadGone,
        Some(code) if DENIED.contains(&code) => Problem::Denied(code.to_string()),
        _ if denied_variant || text.contains("403 Forbidden") => Problem::Denied("HTTP 403 Forbidden".into()),
        _ if text.contains("401 Unauthorized") => Problem::Denied("HTTP 401 Unauthorized".into()),
        _ => Problem::Other,
    }
}

/// Every message of an error's chain, joined.
fn chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        text.push_str(": ");
        text.push_str(&e.to_string());
        current = e.source();
    }
    text
}

/// The last message of an error's chain: what the operating system said ("Connection refused").
fn innermost(error: &(dyn StdError + 'static)) -> String {
    let mut last = error;
    while let Some(e) = last.source() {
        last = e;
    }
    last.to_string()
}

/// The typed error for a failed `operation` on object `name` of `url` at `endpoint`.
pub fn to_error(
    error: &object_store::Error,
    url: &StoreUrl,
    name: &str,
    operation: &'static str,
    endpoint: &str,
) -> Error {
    let (object, key, bucket, endpoint) =
        (url.object(name), url.key(name), url.bucket.clone(), endpoint.to_string());
    match classify(error) {
        Problem::NoSuchBucket => Error::NoSuchBucket { url: object, bucket, endpoint },
        Problem::UploadGone => Error::StoreUploadAborted { url: object, endpoint },
        Problem::Denied(code) => Error::StoreDenied { bucket, key, endpoint, operation, code },
        Problem::Unreachable(reason) => Error::StoreUnreachable { bucket, key, endpoint, reason },
        Problem::Other => {
            let mut reason = chain_text(error);
            if reason.len() > 600 {
                let cut = (0..=600).rev().find(|&i| reason.is_char_boundary(i)).unwrap_or(0);
                reason.truncate(cut);
                reason.push_str("...");
            }
            Error::Store { url: object, operation, endpoint, reason }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What object_store's messages look like for a failed ListObjectsV2 (the body is the
    /// store's XML error document).
    fn listing_failed(status: &str, code: &str) -> String {
        format!(
            "Generic S3 error: Error performing GET http://127.0.0.1:9000/bucket?list-type=2 in 3ms - Server returned non-2xx status code: {status}: <?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>...</Message></Error>"
        )
    }

    #[test]
    fn s3_error_codes_name_the_problem() {
        assert_eq!(
            classify_text(&listing_failed("404 Not Found", "NoSuchBucket"), false),
            Problem::NoSuchBucket
        );
        for code in ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"] {
            assert_eq!(
                classify_text(&listing_failed("403 Forbidden", code), false),
                Problem::Denied(code.into()),
                "{code}"
            );
        }
        assert_eq!(
            classify_text(&listing_failed("404 Not Found", "NoSuchUpload"), false),
            Problem::UploadGone
        );
        assert_eq!(classify_text(&listing_failed("404 Not Found", "NoSuchKey"), false), Problem::Other);
        assert_eq!(
            classify_text(&listing_failed("500 Internal Server Error", "InternalError"), false),
            Problem::Other
        );
    }

    #[test]
    fn a_forbidden_status_without_a_body_is_still_denied() {
        let text = "Generic S3 error: Server returned non-2xx status code: 403 Forbidden: ";
        assert_eq!(classify_text(text, false), Problem::Denied("HTTP 403 Forbidden".into()));
        assert_eq!(classify_text("anything", true), Problem::Denied("HTTP 403 Forbidden".into()));
    }

    #[test]
    fn each_problem_becomes_its_own_error_naming_bucket_key_and_fix() {
        let url = StoreUrl::parse("s3://my-bucket/train/").unwrap();
        let endpoint = "http://127.0.0.1:9";
        let generic = |text: String| object_store::Error::Generic { store: "S3", source: text.into() };
        let failed = |name: &str, operation: &'static str, text: String| {
            to_error(&generic(text), &url, name, operation, endpoint)
        };
        let missing = failed("imgpack.json", "list", listing_failed("404 Not Found", "NoSuchBucket"));
        assert!(matches!(missing, Error::NoSuchBucket { .. }), "{missing:?}");
        let text = missing.to_string();
        assert!(
            text.starts_with("s3://my-bucket/train/imgpack.json: there is no bucket \"my-bucket\""),
            "{text}"
        );
        assert!(text.contains("aws s3 mb s3://my-bucket"), "{text}");

        let denied =
            failed("shard-000000.tar", "upload", listing_failed("403 Forbidden", "InvalidAccessKeyId"));
        let text = denied.to_string();
        assert!(matches!(denied, Error::StoreDenied { .. }), "{denied:?}");
        assert!(
            text.contains("key \"train/shard-000000.tar\"") && text.contains("InvalidAccessKeyId"),
            "{text}"
        );
        assert!(text.contains("AWS_ACCESS_KEY_ID"), "{text}");

        let other = failed("imgpack.index", "upload", "x".repeat(5000));
        let text = other.to_string();
        assert!(matches!(other, Error::Store { operation: "upload", .. }), "{other:?}");
        assert!(text.len() < 1000 && text.contains("run the command again"), "{text}");
    }

    #[test]
    fn a_closed_port_is_unreachable_not_denied_or_missing() {
        // Port 9 (discard) on the loopback address: nothing listens there on a test machine.
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("my-bucket")
            .with_endpoint("http://127.0.0.1:9")
            .with_allow_http(true)
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .with_retry(object_store::RetryConfig { max_retries: 0, ..Default::default() })
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let error = runtime
            .block_on(object_store::ObjectStoreExt::head(&store, &object_store::path::Path::from("x")))
            .unwrap_err();
        match classify(&error) {
            Problem::Unreachable(reason) => assert!(reason.to_lowercase().contains("refused"), "{reason}"),
            other => panic!("a closed port gave {other:?}: {error}"),
        }
    }
}
