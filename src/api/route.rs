//! Which API a request came to: its route (OpenAI's endpoints and Responses, Anthropic's
//! Messages, MindIE's native routes) and the dialect ([`Wire`]) its answers and errors are
//! written in.

use crate::wire::Wire;

/// Which endpoint a body was sent to (or, for `tokengate loadgen`, is sent to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/chat/completions/batch`: vLLM's chat completions of several conversations in
    /// one body (`messages` a list of conversations), answered whole, a choice for each.
    ChatBatch,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The backend path of this endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::ChatBatch => "/v1/chat/completions/batch",
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
    /// `POST /v2/models/{model}/generate` (Triton's generate extension): one whole answer.
    TritonGenerate,
    /// `POST /v2/models/{model}/generate_stream`: always streamed.
    TritonGenerateStream,
}

impl Native {
    /// Its path (the backend's too), Triton's with a `{model}` segment.
    pub fn path(self) -> &'static str {
        match self {
            Native::Infer => "/infer",
            Native::Generate | Native::VllmGenerate => "/generate",
            Native::GenerateStream => "/generate_stream",
            Native::TritonGenerate => "/v2/models/{model}/generate",
            Native::TritonGenerateStream => "/v2/models/{model}/generate_stream",
        }
    }

    /// Whether it is one of Triton's routes, which name the model in their path.
    pub fn is_triton(self) -> bool {
        matches!(self, Native::TritonGenerate | Native::TritonGenerateStream)
    }

    /// Whether the route itself streams (`None`: the body's `stream` says).
    pub(crate) fn streams(self) -> Option<bool> {
        match self {
            Native::Infer | Native::VllmGenerate => None,
            Native::Generate | Native::TritonGenerate => Some(false),
            Native::GenerateStream | Native::TritonGenerateStream => Some(true),
        }
    }
}

/// A pooling route: prompts run through a pooling model (vLLM's `--runner pooling`) for their
/// embeddings or scores; nothing is generated. Served by the backends declared with
/// `runner = "pooling"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooled {
    /// `POST /v1/embeddings`: OpenAI's embeddings (`input`, or `messages` as vLLM takes them).
    Embeddings,
    /// `POST /pooling`: vLLM's raw pooler output, asked as embeddings are.
    Pooling,
    /// `POST /score`: vLLM's scores of `queries` against `documents`.
    Score,
    /// `POST /v1/score`: the same.
    ScoreV1,
    /// `POST /rerank`: Jina's and Cohere's rerank (`query`, `documents`), as vLLM serves it.
    Rerank,
    /// `POST /v1/rerank`: the same.
    RerankV1,
    /// `POST /v2/rerank`: the same.
    RerankV2,
    /// `POST /v2/embed`: Cohere's embed (`texts`, or `inputs` of content parts), as vLLM
    /// serves it; its answer is Cohere's, its errors OpenAI's.
    CohereEmbed,
}

impl Pooled {
    /// Its path (the backend's too).
    pub fn path(self) -> &'static str {
        match self {
            Pooled::Embeddings => "/v1/embeddings",
            Pooled::Pooling => "/pooling",
            Pooled::Score => "/score",
            Pooled::ScoreV1 => "/v1/score",
            Pooled::Rerank => "/rerank",
            Pooled::RerankV1 => "/v1/rerank",
            Pooled::RerankV2 => "/v2/rerank",
            Pooled::CohereEmbed => "/v2/embed",
        }
    }

    /// What its body asks: embeddings of inputs, or scores of documents against queries.
    pub fn kind(self) -> PooledKind {
        match self {
            Pooled::Embeddings | Pooled::Pooling => PooledKind::Embed,
            Pooled::Score | Pooled::ScoreV1 => PooledKind::Score,
            Pooled::Rerank | Pooled::RerankV1 | Pooled::RerankV2 => PooledKind::Rerank,
            Pooled::CohereEmbed => PooledKind::CohereEmbed,
        }
    }
}

/// The three request bodies of the pooling routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PooledKind {
    /// `input` (texts or token ids) or `messages`.
    Embed,
    /// `queries` and `documents` (or their older names).
    Score,
    /// `query` and `documents`.
    Rerank,
    /// Cohere's `texts` or `inputs`.
    CohereEmbed,
}

/// A route of the main listener that the backends answer: generation, or pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI-compatible: `/v1/chat/completions` (and vLLM's `/v1/chat/completions/batch`),
    /// `/v1/completions`.
    OpenAi(Endpoint),
    /// MindIE's native API: `/infer`, `/generate` (TGI's and vLLM's), `/generate_stream`,
    /// Triton's `/v2/models/{model}/generate` and `generate_stream`.
    MindIe(Native),
    /// Anthropic's Messages API: `/v1/messages`.
    Messages,
    /// OpenAI's Responses API: `/v1/responses`.
    Responses,
    /// A pooling route: `/v1/embeddings`, `/pooling`, `/score`, `/rerank` (and their other
    /// paths).
    Pooling(Pooled),
    /// vLLM's generative scoring, `/generative_scoring`: a `query` joined to each of its
    /// `items`, each run by the generating model for one token, whose probabilities of the
    /// `label_token_ids` are the scores.
    GenerativeScoring,
}

impl Route {
    /// Every route the backends answer, in docs/reference.md's order.
    pub const ALL: [Route; 19] = [
        Route::OpenAi(Endpoint::Chat),
        Route::OpenAi(Endpoint::ChatBatch),
        Route::OpenAi(Endpoint::Completions),
        Route::Responses,
        Route::Messages,
        Route::GenerativeScoring,
        Route::MindIe(Native::Infer),
        Route::MindIe(Native::Generate),
        Route::MindIe(Native::GenerateStream),
        Route::MindIe(Native::TritonGenerate),
        Route::MindIe(Native::TritonGenerateStream),
        Route::Pooling(Pooled::Embeddings),
        Route::Pooling(Pooled::Pooling),
        Route::Pooling(Pooled::Score),
        Route::Pooling(Pooled::ScoreV1),
        Route::Pooling(Pooled::Rerank),
        Route::Pooling(Pooled::RerankV1),
        Route::Pooling(Pooled::RerankV2),
        Route::Pooling(Pooled::CohereEmbed),
    ];

    /// Whether it generates (the others pool: no output, nothing decoded).
    pub fn generates(self) -> bool {
        !matches!(self, Route::Pooling(_))
    }

    /// Whether vLLM reads a `cache_salt` in its bodies (its OpenAI routes, Responses and
    /// generative scoring; not its Messages, which takes none, nor its pooling routes).
    pub fn reads_cache_salt(self) -> bool {
        matches!(
            self,
            Route::OpenAi(_) | Route::Responses | Route::GenerativeScoring
        )
    }

    /// The route at `path`, if it is one.
    pub fn from_path(path: &str) -> Option<Route> {
        Route::ALL
            .into_iter()
            .find(|r| path_matches(r.path(), path))
    }

    /// The model a Triton route's `path` names (its `{model}` segment); `None` on the others.
    pub fn path_model(self, path: &str) -> Option<&str> {
        match self {
            Route::MindIe(n) if n.is_triton() => {
                path.strip_prefix("/v2/models/")?.split('/').next()
            }
            _ => None,
        }
    }

    /// The path on the backend: the client's, with the model it serves (`backend_model`) in a
    /// Triton route's path.
    pub fn backend_path(self, backend_model: &str) -> std::borrow::Cow<'static, str> {
        match self {
            Route::MindIe(n) if n.is_triton() => {
                self.path().replace("{model}", backend_model).into()
            }
            _ => self.path().into(),
        }
    }

    /// Its path: the client's and the backend's (a Triton route's as a pattern, with `{model}`).
    pub fn path(self) -> &'static str {
        match self {
            Route::OpenAi(e) => e.path(),
            Route::MindIe(n) => n.path(),
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
            Route::Pooling(p) => p.path(),
            Route::GenerativeScoring => "/generative_scoring",
        }
    }

    /// The format of its answers and errors.
    pub fn wire(self) -> Wire {
        match self {
            Route::Pooling(Pooled::CohereEmbed) => Wire::Cohere,
            Route::OpenAi(_) | Route::Pooling(_) | Route::GenerativeScoring => Wire::OpenAi,
            Route::MindIe(Native::VllmGenerate) => Wire::VllmGenerate,
            Route::MindIe(Native::TritonGenerate | Native::TritonGenerateStream) => Wire::Triton,
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
    /// requires `max_tokens`; the pooling routes generate nothing; generative scoring one
    /// token for each item, whatever the body says.
    pub fn backend_default_max_tokens(self) -> Option<u64> {
        match self {
            Route::OpenAi(Endpoint::Completions) => Some(16),
            Route::GenerativeScoring => Some(1),
            Route::MindIe(
                Native::Generate
                | Native::GenerateStream
                | Native::TritonGenerate
                | Native::TritonGenerateStream,
            ) => Some(20),
            Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch)
            | Route::MindIe(Native::Infer | Native::VllmGenerate)
            | Route::Messages
            | Route::Responses
            | Route::Pooling(_) => None,
        }
    }

    /// Where a request may send several prompts: the member that lists them and what a
    /// refusal of their number calls them ("send fewer conversations"). `None` on a route of
    /// one prompt. A score or rerank body's queries and documents are its prompts.
    pub fn prompts_listed(self) -> Option<(&'static str, &'static str)> {
        match self {
            Route::OpenAi(Endpoint::Completions) => Some(("prompt", "prompts")),
            Route::OpenAi(Endpoint::ChatBatch) => Some(("messages", "conversations")),
            Route::GenerativeScoring => Some(("items", "items")),
            Route::Pooling(p) => Some(match p.kind() {
                PooledKind::Embed => ("input", "inputs"),
                PooledKind::Score | PooledKind::Rerank => ("documents", "queries and documents"),
                PooledKind::CohereEmbed => ("texts", "texts"),
            }),
            Route::OpenAi(Endpoint::Chat)
            | Route::Messages
            | Route::Responses
            | Route::MindIe(_) => None,
        }
    }

    /// The field holding the prompt, named by errors about its length.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch) | Route::Messages => "messages",
            Route::Responses | Route::Pooling(Pooled::Embeddings | Pooled::Pooling) => "input",
            Route::Pooling(Pooled::Score | Pooled::ScoreV1) => "queries",
            Route::Pooling(Pooled::Rerank | Pooled::RerankV1 | Pooled::RerankV2)
            | Route::GenerativeScoring => "query",
            Route::OpenAi(Endpoint::Completions) | Route::MindIe(Native::VllmGenerate) => "prompt",
            Route::Pooling(Pooled::CohereEmbed) => "texts",
            Route::MindIe(Native::TritonGenerate | Native::TritonGenerateStream) => "text_input",
            Route::MindIe(_) => "inputs",
        }
    }
}

/// Whether `path` is the route `pattern`: the same, a `{model}` segment matching any one
/// segment of MindIE's model-name characters (letters, digits, `_`, `-`, `.`).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let Some((before, after)) = pattern.split_once("{model}") else {
        return pattern == path;
    };
    let Some(model) = (path.strip_prefix(before)).and_then(|rest| rest.strip_suffix(after)) else {
        return false;
    };
    !model.is_empty()
        && (model.bytes()).all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_triton_path_names_its_model_in_one_segment() {
        let generate = Route::MindIe(Native::TritonGenerate);
        assert!(path_matches(
            generate.path(),
            "/v2/models/qwen3.5-27b/generate"
        ));
        assert_eq!(
            Route::from_path("/v2/models/qwen_1/generate_stream"),
            Some(Route::MindIe(Native::TritonGenerateStream))
        );
        for path in [
            "/v2/models//generate",
            "/v2/models/a/b/generate",
            "/v2/models/a%20b/generate",
            "/v2/models/qwen/versions/1/generate",
            "/v2/models/qwen/generate/",
        ] {
            assert_eq!(Route::from_path(path), None, "{path}");
        }
        assert_eq!(
            generate.path_model("/v2/models/qwen3.5-27b/generate"),
            Some("qwen3.5-27b")
        );
        assert_eq!(
            generate.backend_path("served"),
            "/v2/models/served/generate"
        );
        let chat = Route::OpenAi(Endpoint::Chat);
        assert_eq!(chat.path_model("/v1/chat/completions"), None);
        assert_eq!(chat.backend_path("served"), "/v1/chat/completions");
        assert_eq!(
            Route::from_path("/v1/chat/completions/batch"),
            Some(Route::OpenAi(Endpoint::ChatBatch))
        );
        assert_eq!(Route::from_path("/v1/chat/completions/batch/"), None);
        assert_eq!(
            Route::from_path("/generate"),
            Some(Route::MindIe(Native::Generate))
        );
    }
}
