//! Which API a request came to: its route (OpenAI's endpoints and Responses, Anthropic's
//! Messages, MindIE's native routes) and the dialect ([`Wire`]) its answers and errors are
//! written in.

use crate::wire::Wire;

/// Which endpoint a body was sent to (or, for `tokengate loadgen`, is sent to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The backend path of this endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// A native route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Native {
    /// `POST /infer`: streamed when the body's `stream` is true.
    Infer,
    /// `POST /generate`: one whole answer.
    Generate,
    /// `POST /generate_stream`: always streamed.
    GenerateStream,
    /// `POST /generate` with a `prompt` (MindIE's vLLM-compatible API): streamed when the
    /// body's `stream` is true. Not a route of its own: a `/generate` body is parsed as this
    /// one when it has a `prompt`, as MindIE tells the two apart.
    VllmGenerate,
}

impl Native {
    /// Its path (the backend's too).
    pub fn path(self) -> &'static str {
        match self {
            Native::Infer => "/infer",
            Native::Generate | Native::VllmGenerate => "/generate",
            Native::GenerateStream => "/generate_stream",
        }
    }

    /// Whether the route itself streams (`None`: the body's `stream` says).
    pub(crate) fn streams(self) -> Option<bool> {
        match self {
            Native::Infer | Native::VllmGenerate => None,
            Native::Generate => Some(false),
            Native::GenerateStream => Some(true),
        }
    }
}

/// A generation route of the main listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI-compatible: `/v1/chat/completions`, `/v1/completions`.
    OpenAi(Endpoint),
    /// MindIE's native API: `/infer`, `/generate` (TGI's and vLLM's), `/generate_stream`.
    MindIe(Native),
    /// Anthropic's Messages API: `/v1/messages`.
    Messages,
    /// OpenAI's Responses API: `/v1/responses`.
    Responses,
}

impl Route {
    /// Every generation route, in the README's order.
    pub const ALL: [Route; 7] = [
        Route::OpenAi(Endpoint::Chat),
        Route::OpenAi(Endpoint::Completions),
        Route::Responses,
        Route::Messages,
        Route::MindIe(Native::Infer),
        Route::MindIe(Native::Generate),
        Route::MindIe(Native::GenerateStream),
    ];

    /// The generation route at `path`, if it is one.
    pub fn from_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.path() == path)
    }

    /// The backend path: the same as the client's.
    pub fn path(self) -> &'static str {
        match self {
            Route::OpenAi(e) => e.path(),
            Route::MindIe(n) => n.path(),
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
        }
    }

    /// The format of its answers and errors.
    pub fn wire(self) -> Wire {
        match self {
            Route::OpenAi(_) => Wire::OpenAi,
            Route::MindIe(Native::VllmGenerate) => Wire::VllmGenerate,
            Route::MindIe(_) => Wire::Tgi,
            Route::Messages => Wire::Anthropic,
            Route::Responses => Wire::Responses,
        }
    }

    /// What the backend generates at most when a request sets no output limit, where that is
    /// a fixed number: 16 on `/v1/completions` (vLLM's request model), 20 on MindIE's TGI
    /// routes `/generate` and `/generate_stream` (TGI's `max_new_tokens`). `None` where the
    /// backend allows up to the context (vLLM's chat and responses) or its default is not known
    /// (`/infer`, and MindIE's `maxIterTimes` on its vLLM-style `/generate`); `/v1/messages`
    /// requires `max_tokens`.
    pub fn backend_default_max_tokens(self) -> Option<u64> {
        match self {
            Route::OpenAi(Endpoint::Completions) => Some(16),
            Route::MindIe(Native::Generate | Native::GenerateStream) => Some(20),
            Route::OpenAi(Endpoint::Chat)
            | Route::MindIe(Native::Infer | Native::VllmGenerate)
            | Route::Messages
            | Route::Responses => None,
        }
    }

    /// The field holding the prompt, named by errors about its length.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Route::OpenAi(Endpoint::Chat) | Route::Messages => "messages",
            Route::Responses => "input",
            Route::OpenAi(Endpoint::Completions) | Route::MindIe(Native::VllmGenerate) => "prompt",
            Route::MindIe(_) => "inputs",
        }
    }
}
