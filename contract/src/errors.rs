//! Error text for messages that reach users (task failure reasons, status conditions, logs).

/// An error followed by its sources, joined by ": ", skipping a source whose text the message
/// already holds. HTTP clients put the cause (connection refused, DNS, TLS, timeout) in the
/// sources and only "error sending request" in the message itself.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        cause: Option<Box<Layer>>,
    }

    fn layer(text: &'static str, cause: Option<Layer>) -> Layer {
        Layer {
            text,
            cause: cause.map(Box::new),
        }
    }

    #[test]
    fn sources_follow_the_message_once() {
        let refused = layer("Connection refused (os error 111)", None);
        let connect = layer(
            "tcp connect error: Connection refused (os error 111)",
            Some(refused),
        );
        let top = layer("error sending request for url (http://x/)", Some(connect));
        assert_eq!(
            error_chain(&top),
            "error sending request for url (http://x/): tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(error_chain(&layer("alone", None)), "alone");
    }
}
