//! How to reach a store: endpoint, credentials, retries.
//!
//! The settings are the AWS CLI's environment variables, so a machine set up for `aws s3`
//! with them needs nothing more (`~/.aws` profiles are not read: `object_store` does not):
//! credentials from the usual chain (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` /
//! `AWS_SESSION_TOKEN`, web identity, container and instance metadata, read by
//! `object_store`'s `AmazonS3Builder::from_env`), the region from `AWS_REGION` or
//! `AWS_DEFAULT_REGION`, and the endpoint of an S3-compatible store (MinIO, Ceph, SeaweedFS,
//! R2) from `--endpoint`, `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`. An `http://` endpoint is
//! a local store: it is allowed without `AWS_ALLOW_HTTP`, since writing the scheme out is the
//! request.

use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{BackoffConfig, RetryConfig};

use super::url::StoreUrl;
use crate::{Error, Result};

/// The environment variable the AWS CLI and SDKs read the endpoint from.
pub const ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL";

/// The AWS CLI's S3-only endpoint variable, which wins over [`ENDPOINT_ENV`] there (and in
/// `object_store`).
pub const S3_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_S3";

/// Retries for the work itself: transient errors (timeouts, 5xx, `SlowDown`, dropped or refused
/// connections) are retried with exponential backoff (jittered, 100 ms growing to 15 s) for up
/// to 3 minutes per request, which keeps a request's signature valid. `object_store`'s default
/// of 10 tries can be spent in a few seconds of jittered backoff — less than a store takes to
/// restart (the interop tests kill and restart one mid-upload) — so the time is the bound here,
/// not the count.
pub fn work_retries() -> RetryConfig {
    RetryConfig { max_retries: 100, retry_timeout: Duration::from_secs(180), ..RetryConfig::default() }
}

/// Retries for the first request of a run, which checks bucket, credentials and endpoint: a
/// store that is not there at the start is a setting to fix, not a hiccup to wait out for
/// minutes, so it is retried briefly.
pub fn check_retries() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// The endpoint to use: `--endpoint`, else `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`, else
/// none (AWS itself) — the AWS CLI's order, with the flag first.
pub fn endpoint(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |value: Option<String>| value.filter(|e| !e.trim().is_empty());
    set(flag.map(str::to_string)).or_else(|| set(env(S3_ENDPOINT_ENV))).or_else(|| set(env(ENDPOINT_ENV)))
}

/// How an endpoint is named in messages.
pub fn endpoint_name(endpoint: Option<&str>) -> String {
    endpoint.map_or_else(
        || "AWS S3 (no --endpoint, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL set)".to_string(),
        str::to_string,
    )
}

/// A client for `url`'s bucket at `endpoint`, retrying as `retry` says.
pub fn client(url: &StoreUrl, endpoint: Option<&str>, retry: RetryConfig) -> Result<AmazonS3> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket).with_retry(retry);
    if let Some(endpoint) = endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::BadLocation {
                location: format!("--endpoint {endpoint}"),
                reason: "write the endpoint as a URL, e.g. http://127.0.0.1:8333 or https://s3.example.com"
                    .into(),
            });
        }
        // Both keys: `object_store` prefers an `AWS_ENDPOINT_URL_S3` from the environment over
        // the plain endpoint, which would otherwise override --endpoint silently.
        builder = builder.with_endpoint(endpoint).with_config(AmazonS3ConfigKey::S3Endpoint, endpoint);
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    builder.build().map_err(|e| Error::BadLocation {
        location: url.to_string(),
        reason: format!(
            "cannot set up the store client: {e}; check --endpoint, AWS_ENDPOINT_URL and the AWS_* variables"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_environment_and_empty_means_unset() {
        let env = |name: &str| (name == ENDPOINT_ENV).then(|| "http://env:1".to_string());
        assert_eq!(endpoint(Some("http://flag:2"), env).as_deref(), Some("http://flag:2"));
        assert_eq!(endpoint(None, env).as_deref(), Some("http://env:1"));
        assert_eq!(endpoint(None, |_| None), None);
        assert_eq!(endpoint(None, |_| Some(" ".into())), None);
        let both = |name: &str| {
            Some(if name == S3_ENDPOINT_ENV { "http://s3-only:3" } else { "http://env:1" }.into())
        };
        assert_eq!(endpoint(None, both).as_deref(), Some("http://s3-only:3"));
        assert_eq!(endpoint(Some("http://flag:2"), both).as_deref(), Some("http://flag:2"));
    }

    #[test]
    fn an_endpoint_that_is_not_a_url_is_refused_naming_the_flag() {
        let url = StoreUrl::parse("s3://bucket/x/").unwrap();
        let err = client(&url, Some("127.0.0.1:8333"), check_retries()).unwrap_err().to_string();
        assert!(err.contains("--endpoint 127.0.0.1:8333") && err.contains("http://"), "{err}");
        assert!(client(&url, Some("http://127.0.0.1:8333"), check_retries()).is_ok());
    }
}
