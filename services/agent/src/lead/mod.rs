//! The lead agent (`runs.agent: lead`): a model ⇄ tools loop inside a run (DESIGN §5).
//!
//! By file: the loop (`runner.rs`), the streamed model call (`model.rs`), tool execution and the
//! side-effect journal around it (`tool_exec.rs`), the middleware pipeline (`pipeline.rs`) and its
//! layers (`middleware/`), the tools (`tools/`), the thread state and its checkpoint form
//! (`state.rs`), what one run shares (`run_env.rs`), settings (`config.rs`).

pub mod config;
pub mod guardrail_providers;
pub mod middleware;
pub mod model;
pub mod model_info;
pub mod pipeline;
pub mod prompt;
pub mod run_env;
pub mod runner;
pub mod skills;
pub mod state;
pub mod subagents;
pub mod thinking;
pub mod tool_exec;
pub mod tools;

use std::sync::Arc;

use antler_proto::runs::RunError;
use futures::future::BoxFuture;

use self::config::LeadConfig;
use self::pipeline::Pipeline;
use self::tool_exec::ExecuteTool;
use self::tools::ToolSet;
use super::{Agent, AgentContext, AgentFactory, RunSpec};
use crate::outcome::Outcome;

/// Builds a [`LeadAgent`] per run (middlewares keep per-run state).
#[derive(Clone, Default)]
pub struct LeadFactory {
    pub config: LeadConfig,
    /// Layers added by the embedding program, built fresh for every run.
    pub custom: Vec<CustomLayer>,
}

impl std::fmt::Debug for LeadFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeadFactory").field("config", &self.config).field("custom", &self.custom.len()).finish()
    }
}

/// Builds one run's instance of a custom layer.
pub type BuildLayer = Arc<dyn Fn(&RunSpec) -> Arc<dyn pipeline::Middleware> + Send + Sync>;

/// A custom middleware and where it goes: replacing a built-in layer, or inserted after / before an
/// anchor (a layer name), or with neither just before Clarification.
#[derive(Clone)]
pub struct CustomLayer {
    pub build: BuildLayer,
    pub replaces: Option<&'static str>,
    pub after: Option<&'static str>,
    pub before: Option<&'static str>,
}

impl LeadFactory {
    /// The pipeline of one run: the built-in layers under the configuration, then the custom ones.
    pub fn pipeline(&self, spec: &RunSpec) -> Result<Pipeline, pipeline::PipelineError> {
        let config = spec.request.config.clone().unwrap_or_default();
        let delegates = self.delegates(spec);
        let subagents = &self.config.subagents;
        let layers = middleware::RunLayers {
            plan_mode: config.plan_mode,
            clarification_disabled: config.clarification_disabled,
            token_budget: self.config.token_budget.effective(config.token_budget),
            subagent_limit: delegates
                .then(|| (subagents.concurrent(config.max_concurrent_subagents), subagents.total(config.max_total_subagents))),
            subagent: spec.request.subagent.is_some(),
        };
        let mut base = middleware::defaults(&self.config, layers);
        let mut extras = Vec::new();
        for custom in &self.custom {
            let layer = (custom.build)(spec);
            match custom.replaces.and_then(|name| base.iter().position(|l| l.name() == name)) {
                Some(at) => base[at] = layer,
                None => extras.push(pipeline::Extra { layer, after: custom.after, before: custom.before }),
            }
        }
        Pipeline::build(base, extras)
    }
}

impl LeadFactory {
    /// Whether a run gets the `task` tool: it asked (`config.subagents_enabled`) or the configuration
    /// offers it to every run — never a subagent's own run (no nesting).
    pub fn delegates(&self, spec: &RunSpec) -> bool {
        spec.request.subagent.is_none()
            && (self.config.subagents.enabled || spec.request.config.as_ref().is_some_and(|c| c.subagents_enabled))
    }
}

impl AgentFactory for LeadFactory {
    fn build(&self, spec: &RunSpec) -> Result<Box<dyn Agent>, RunError> {
        let plan_mode = spec.request.config.as_ref().is_some_and(|c| c.plan_mode);
        let start_failed = |message: String| RunError { code: "start_failed".to_owned(), message, retryable: false, details: None };
        let pipeline = self.pipeline(spec).map_err(|e| start_failed(format!("the lead agent's middleware pipeline is invalid: {e}")))?;
        let mut tools = ToolSet::builtin(plan_mode);
        tools.add_web(&self.config.web).map_err(|e| start_failed(format!("the web tools (runs.lead.web) cannot be built: {e}")))?;
        let mut base =
            if self.config.system_prompt.is_empty() { prompt::SYSTEM_PROMPT.to_owned() } else { self.config.system_prompt.clone() };
        let mut builtin_prompt = self.config.system_prompt.is_empty();
        let mut caller = "lead_agent".to_owned();
        let mut subagent = None;
        if let Some(task) = &spec.request.subagent {
            let Some(def) = self.config.subagents.registry().remove(&task.subagent_type) else {
                return Err(start_failed(format!(
                    "subagent type `{}` is not configured (runs.lead.subagents)\nhint: the configuration changed after the task started",
                    task.subagent_type
                )));
            };
            base = if def.system_prompt.is_empty() { subagents::SUBAGENT_PROMPT.to_owned() } else { def.system_prompt.clone() };
            builtin_prompt = def.system_prompt.is_empty();
            caller = format!("subagent:{}", task.subagent_type);
            tools.retain(|name| def.allows(name));
            subagent = Some(def);
        } else if self.delegates(spec) {
            tools.extend([Arc::new(tools::task::Task::new(self.config.subagents.registry())) as Arc<dyn tools::Tool>]);
        }
        if self.config.skill_evolution.enabled {
            tools.extend([Arc::new(tools::skill_manage::SkillManage) as Arc<dyn tools::Tool>]);
        }
        if let Some(acp) = tools::acp::InvokeAcpAgent::new(&self.config.acp_agents, &self.config.acp) {
            tools.extend([Arc::new(acp) as Arc<dyn tools::Tool>]);
        }
        if builtin_prompt && (tools.get("web_search").is_some() || tools.get("web_fetch").is_some()) {
            base.push_str(prompt::WEB_RESEARCH);
        }
        let system_prompt = prompt::with_context(base, spec.request.config.as_ref().and_then(|c| c.context.as_ref()));
        Ok(Box::new(LeadAgent {
            pipeline,
            executor: ExecuteTool { tools: tools.clone() },
            tools,
            system_prompt,
            catalog_hash: String::new(),
            mcp_enabled: self.config.mcp.enabled,
            caller,
            subagent,
            skills_enabled: self.config.skills.enabled,
            skills: Vec::new(),
            truncated_answer: self.config.truncated_answer,
            thinking_unsupported: self.config.thinking_unsupported,
            thinking_dropped: None,
        }))
    }
}

/// See the module documentation.
pub struct LeadAgent {
    pub pipeline: Pipeline,
    pub tools: ToolSet,
    pub executor: ExecuteTool,
    pub system_prompt: String,
    /// The MCP service's hash of the deferred tools of this attempt (empty: none deferred).
    pub catalog_hash: String,
    /// Whether the attempt lists the MCP service's tools (`runs.lead.mcp.enabled`).
    pub mcp_enabled: bool,
    /// The caller tag of its model calls: `lead_agent`, or `subagent:<type>` in a subagent's run.
    pub caller: String,
    /// In a subagent's run: its type (the tools it may use, its turn limit).
    pub subagent: Option<subagents::SubagentDef>,
    /// Whether the attempt lists the user's skills (`runs.lead.skills.enabled`).
    pub skills_enabled: bool,
    /// The user's enabled skills, listed at the start of the attempt.
    pub skills: Vec<skills::SkillInfo>,
    /// How an answer cut at the model's output limit ends (`runs.lead.truncated_answer`).
    pub truncated_answer: config::TruncatedAnswer,
    /// What a request for thinking on a model without it does (`runs.lead.thinking_unsupported`).
    pub thinking_unsupported: thinking::ThinkingUnsupported,
    /// The run's model, when the run asked it to think but it cannot and its calls go without.
    pub thinking_dropped: Option<String>,
}

impl LeadAgent {
    /// Adds the MCP tools the run's user sees. They are listed at the start of every attempt, so a
    /// resumed run gets the servers' tools as they are now; deferred ones are named in the system
    /// prompt and come with `tool_search`.
    async fn add_mcp_tools(&mut self, ctx: &AgentContext) {
        let catalog = tools::mcp::discover(ctx).await;
        tracing::debug!(run_id = %ctx.spec.run_id, "{catalog}");
        if catalog.tools.is_empty() {
            return;
        }
        let deferred = catalog.deferred_names();
        if !deferred.is_empty() {
            self.system_prompt.push_str(&tools::tool_search::deferred_section(&deferred));
            self.tools.extend([Arc::new(tools::tool_search::ToolSearch) as Arc<dyn tools::Tool>]);
        }
        self.catalog_hash = catalog.catalog_hash;
        self.tools.extend(catalog.tools.into_iter().map(|t| t as Arc<dyn tools::Tool>));
        self.executor = ExecuteTool { tools: self.tools.clone() };
    }
}

impl Agent for LeadAgent {
    fn run(mut self: Box<Self>, ctx: AgentContext) -> BoxFuture<'static, Outcome> {
        // Boxed before the future captures it: a captured value keeps its room in the future for the
        // whole run even after `runner::run` takes it, and the context (the run's whole request
        // among it) would be there twice while the run waits on its model.
        let ctx = Box::new(ctx);
        Box::pin(async move {
            if self.skills_enabled {
                self.skills = skills::discover(&ctx).await;
                // A subagent type with a `skills` list sees (and can activate) only those.
                if let Some(def) = &self.subagent {
                    self.skills.retain(|skill| def.allows_skill(&skill.name));
                }
                self.system_prompt.push_str(&skills::prompt_section(&self.skills));
            }
            if self.mcp_enabled {
                self.add_mcp_tools(&ctx).await;
            }
            let model = model_info::run_model(&ctx).await;
            let asked = ctx.spec.request.config.as_ref().and_then(|c| c.thinking_enabled).unwrap_or(false);
            self.thinking_dropped = thinking::dropped(asked, model.as_ref(), self.thinking_unsupported);
            // view_image only for a model that can look (DeerFlow offers it the same way).
            if model.and_then(|m| m.capabilities).is_some_and(|c| c.supports_vision) {
                self.tools.extend([Arc::new(tools::view_image::ViewImage) as Arc<dyn tools::Tool>]);
                self.executor = ExecuteTool { tools: self.tools.clone() };
            }
            // A subagent gets only the tools its type allows, MCP tools included.
            if let Some(def) = &self.subagent {
                self.tools.retain(|name| def.allows(name));
                self.executor = ExecuteTool { tools: self.tools.clone() };
            }
            runner::run(&self, *ctx).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::pipeline::Middleware;

    struct Named(&'static str);
    impl Middleware for Named {
        fn name(&self) -> &'static str {
            self.0
        }
    }

    fn spec() -> RunSpec {
        RunSpec {
            run_id: "r".to_owned(),
            thread_id: "t".to_owned(),
            user_id: "u".to_owned(),
            attempt: 1,
            request: Default::default(),
            secrets: Arc::new(crate::RunSecrets::none()),
            resume_from: None,
            resumed: false,
            tokens_before: 0,
        }
    }

    fn custom(name: &'static str, replaces: Option<&'static str>, after: Option<&'static str>) -> CustomLayer {
        CustomLayer { build: Arc::new(move |_| Arc::new(Named(name)) as Arc<dyn Middleware>), replaces, after, before: None }
    }

    #[test]
    fn the_default_order_follows_deerflow() {
        let names = LeadFactory::default().pipeline(&spec()).map(|p| p.names()).unwrap_or_default();
        assert_eq!(
            names,
            vec![
                "ThreadData",
                "Uploads",
                "Sandbox",
                "DanglingToolCall",
                "ToolErrorHandling",
                "SkillToolPolicy",
                "Title",
                "LoopDetection",
                "Clarification"
            ]
        );
    }

    #[test]
    fn layers_can_be_switched_off_replaced_and_added_by_anchor() {
        let mut config = LeadConfig::default();
        config.middlewares.disabled = vec!["Uploads".to_owned(), "LoopDetection".to_owned()];
        config.guardrails.enabled = true;
        let factory = LeadFactory {
            config,
            custom: vec![custom("MyTitle", Some("Title"), None), custom("Audit", None, Some("Guardrail")), custom("Tail", None, None)],
        };
        let names = factory.pipeline(&spec()).map(|p| p.names()).unwrap_or_default();
        assert_eq!(
            names,
            vec![
                "ThreadData",
                "Sandbox",
                "DanglingToolCall",
                "Guardrail",
                "Audit",
                "ToolErrorHandling",
                "SkillToolPolicy",
                "MyTitle",
                "Tail",
                "Clarification"
            ]
        );
    }

    #[test]
    fn clarification_cannot_be_switched_off_and_unknown_names_are_refused() {
        let mut config = LeadConfig::default();
        config.middlewares.disabled = vec!["Clarification".to_owned()];
        assert!(config.validate().is_err());
        config.middlewares.disabled = vec!["Nope".to_owned()];
        assert!(config.validate().is_err());
        config.middlewares.disabled = vec!["Title".to_owned()];
        assert!(config.validate().is_ok());
    }
}
