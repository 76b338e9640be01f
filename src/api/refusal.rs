//! What the readers of this room refuse: a body that is not what its route takes. A reader
//! says what was wrong and which field; the error room makes it an answer (a 400
//! `invalid_request` naming `param`, or a 404 `model_not_found`) by one `From`, so the wire
//! formats know nothing of statuses, headers or the error body.

use crate::tokenize::chat::TemplateError;

/// A request body refused by its reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// What was wrong.
    pub kind: RefusalKind,
    /// A human message naming the field and the numbers.
    pub message: String,
    /// The field at fault, if one.
    pub param: Option<String>,
}

/// The two ways a body is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The body, or a field of it, is not what the route takes.
    Invalid,
    /// `model` names a model the gateway does not serve.
    ModelNotFound,
}

impl Refusal {
    /// The body is not what the route takes.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            kind: RefusalKind::Invalid,
            message: message.into(),
            param: None,
        }
    }

    /// The field `param` is not what the route takes.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// `model` names `model`, which the gateway does not serve (OpenAI's words for it).
    pub fn model_not_found(model: &str) -> Self {
        Self {
            kind: RefusalKind::ModelNotFound,
            message: format!("The model `{model}` does not exist or you do not have access to it."),
            param: Some("model".to_owned()),
        }
    }

    /// The same refusal, naming `param`.
    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }
}

impl From<TemplateError> for Refusal {
    /// The field the template refused, or `messages`.
    fn from(err: TemplateError) -> Self {
        match err {
            TemplateError::Invalid { param, message } => Refusal::invalid_param(&param, message),
            other => Refusal::invalid_param("messages", other.to_string()),
        }
    }
}
