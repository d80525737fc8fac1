//! A [`Config`] compiled once: fingerprint and result rules, and a table of tools that records,
//! once per tool name, its category, key lists and whether it is a shell or a known tool.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use loopguard_rules::{Config, Detector, Detectors, Ladder};

use crate::fingerprint::{FingerprintRules, ToolKeys};
use crate::hash::{MapHasher, hash_str};
use crate::normalize::ResultRules;
use crate::plugins::Plugins;

/// Tools beyond this many distinct names are not cached (they share the last id).
const MAX_TOOLS: usize = u16::MAX as usize;

/// What the engine decided once about one tool name.
#[derive(Debug)]
pub struct ToolInfo {
    pub id: u16,
    pub name: Box<str>,
    /// Index into `Config::categories`.
    pub category: Option<usize>,
    pub keys: ToolKeys,
    /// False when `unknown_tool.known_tools` is non-empty and does not list it.
    pub known: bool,
    /// Its category `modifies`: a successful call is progress for the calls around it.
    pub modifies: bool,
    /// Its category `waits`: its calls are waits (`flag::WAIT`).
    pub waits: bool,
    /// Every call of it runs tests (`test_fix.test_tools`): `flag::TEST`.
    pub tests: bool,
    /// `false`: the policy switched the tool (or its category) off; its events are ignored.
    pub watched: bool,
    /// Detectors that never fire on it (bit `Det as u8`).
    pub exempt: u16,
}

impl ToolInfo {
    /// Whether `det` may fire on this tool.
    pub fn watched_by(&self, det: crate::detect::Det) -> bool {
        self.exempt & (1 << (det as u16)) == 0
    }
}

/// Tool ids, shared by every variant of one engine's rules (whatever their configuration), so
/// that an id in a session's window means the same tool name when the session's rules change.
#[derive(Debug, Default)]
pub(crate) struct ToolIds {
    by_name: HashMap<Box<str>, u16, BuildHasherDefault<MapHasher>>,
    count: usize,
}

impl ToolIds {
    /// The id of `name`, given on its first use; `u16::MAX` once the table is full.
    fn id(&mut self, name: &str) -> u16 {
        if let Some(&id) = self.by_name.get(name) {
            return id;
        }
        if self.count >= MAX_TOOLS {
            return u16::MAX;
        }
        let id = self.count as u16;
        self.count += 1;
        self.by_name.insert(name.into(), id);
        id
    }
}

/// Tool decisions each thread found last, each with the number of the [`ToolTable`] it came
/// from and its key (the hash of its name, or its id): most events name one of a few tools,
/// which are then found without the table's lock and map.
struct Recent {
    slots: [Option<(u64, u64, Arc<ToolInfo>)>; RECENT_SLOTS],
    /// The slot the next new decision takes.
    next: usize,
}

const RECENT_SLOTS: usize = 8;

impl Recent {
    const fn new() -> Recent {
        Recent {
            slots: [const { None }; RECENT_SLOTS],
            next: 0,
        }
    }

    /// The decision kept for `table` under `key` that `same` accepts.
    #[inline]
    fn find(
        &self,
        table: u64,
        key: u64,
        same: impl Fn(&ToolInfo) -> bool,
    ) -> Option<Arc<ToolInfo>> {
        self.slots.iter().flatten().find_map(|(t, k, info)| {
            (*t == table && *k == key && same(info)).then(|| Arc::clone(info))
        })
    }

    fn keep(&mut self, table: u64, key: u64, info: &Arc<ToolInfo>) {
        if let Some(slot) = self.slots.get_mut(self.next % RECENT_SLOTS) {
            *slot = Some((table, key, Arc::clone(info)));
        }
        self.next = self.next.wrapping_add(1);
    }
}

thread_local! {
    static RECENT_BY_NAME: RefCell<Recent> = const { RefCell::new(Recent::new()) };
    static RECENT_BY_ID: RefCell<Recent> = const { RefCell::new(Recent::new()) };
}

/// Numbers tool tables for the per-thread caches (a number is never reused).
static TABLES: AtomicU64 = AtomicU64::new(1);

fn table_number() -> u64 {
    TABLES.fetch_add(1, Ordering::Relaxed)
}

/// The decisions of one configuration about the tools it has seen, by name and by id.
#[derive(Debug, Default)]
struct ToolTable {
    by_name: HashMap<Box<str>, Arc<ToolInfo>, BuildHasherDefault<MapHasher>>,
    by_id: Vec<Option<Arc<ToolInfo>>>,
}

/// The policy's configuration, compiled for the detectors.
#[derive(Debug)]
pub struct CompiledRules {
    pub(crate) config: Config,
    // What settings never change is shared by every variant of one engine's rules (see
    // [`CompiledRules::with_settings`]): the tool table above all, so that a session whose
    // settings change keeps tool ids that mean the same tools.
    pub(crate) fingerprint: Arc<FingerprintRules>,
    pub(crate) results: Arc<ResultRules>,
    tools: Arc<RwLock<ToolTable>>,
    /// The number of `tools` in the per-thread caches.
    table: u64,
    ids: Arc<RwLock<ToolIds>>,
    /// Detector plugins (none without the `plugins` feature).
    pub(crate) plugins: Arc<Plugins>,
}

impl CompiledRules {
    /// Compiles a resolved configuration (regexes, tool decisions), with no plugins.
    pub fn new(config: Config) -> CompiledRules {
        CompiledRules {
            fingerprint: Arc::new(FingerprintRules::from_config(&config)),
            results: Arc::new(ResultRules::from_config(&config)),
            config,
            tools: Arc::default(),
            table: table_number(),
            ids: Arc::default(),
            plugins: Arc::default(),
        }
    }

    /// A variant of these rules with run-time settings applied over their configuration (the
    /// session tier, see [`loopguard_rules::tiers`]). Settings only change thresholds, the TTL,
    /// the ladder and whether detection runs, so the variant shares the fingerprint and result
    /// rules, the tool table (tool ids mean the same tools in every variant) and the plugins.
    pub fn with_settings(&self, settings: &loopguard_rules::Settings) -> CompiledRules {
        let mut config = self.config.clone();
        settings.apply(&mut config);
        CompiledRules {
            config,
            fingerprint: Arc::clone(&self.fingerprint),
            results: Arc::clone(&self.results),
            tools: Arc::clone(&self.tools),
            table: self.table,
            ids: Arc::clone(&self.ids),
            plugins: Arc::clone(&self.plugins),
        }
    }

    /// Rules for another resolved configuration of the same policy (the policy's overrides
    /// for another backend or model): compiled anew, sharing the plugins and the tool ids, so a
    /// session moved onto them keeps a window whose tool ids mean the same tool names.
    pub(crate) fn sibling(&self, config: Config) -> CompiledRules {
        CompiledRules {
            fingerprint: Arc::new(FingerprintRules::from_config(&config)),
            results: Arc::new(ResultRules::from_config(&config)),
            config,
            tools: Arc::default(),
            table: table_number(),
            ids: Arc::clone(&self.ids),
            plugins: Arc::clone(&self.plugins),
        }
    }

    /// Compiled rules that also run detector plugins.
    #[cfg(feature = "plugins")]
    pub fn with_plugins(
        config: Config,
        plugins: Vec<crate::plugins::LoadedPlugin>,
    ) -> CompiledRules {
        CompiledRules {
            plugins: Arc::new(Plugins::new(plugins)),
            ..CompiledRules::new(config)
        }
    }

    /// The detector plugins that run.
    pub fn plugins(&self) -> &Plugins {
        &self.plugins
    }

    /// The configuration the rules were compiled from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The detector parameters of a category (or the top-level ones).
    pub fn detectors(&self, category: Option<usize>) -> &Detectors {
        category
            .and_then(|i| self.config.categories.get(i))
            .map_or(&self.config.detectors, |c| &c.detectors)
    }

    /// The decision about a tool name, made on its first use.
    pub fn tool(&self, name: &str) -> Arc<ToolInfo> {
        let key = hash_str(name);
        let found = RECENT_BY_NAME.with(|cell| {
            cell.try_borrow()
                .ok()?
                .find(self.table, key, |info| *info.name == *name)
        });
        if let Some(info) = found {
            return info;
        }
        let info = self.tool_in_table(name);
        if info.id != u16::MAX {
            RECENT_BY_NAME.with(|cell| {
                if let Ok(mut recent) = cell.try_borrow_mut() {
                    recent.keep(self.table, key, &info);
                }
            });
        }
        info
    }

    /// [`CompiledRules::tool`] from the table.
    fn tool_in_table(&self, name: &str) -> Arc<ToolInfo> {
        {
            let table = self.tools.read().unwrap_or_else(|e| e.into_inner());
            if let Some(info) = table.by_name.get(name) {
                return Arc::clone(info);
            }
        }
        let mut table = self.tools.write().unwrap_or_else(|e| e.into_inner());
        if let Some(info) = table.by_name.get(name) {
            return Arc::clone(info);
        }
        let id = self.ids.write().unwrap_or_else(|e| e.into_inner()).id(name);
        let info = Arc::new(self.describe(id, name));
        if id != u16::MAX {
            table.by_name.insert(name.into(), Arc::clone(&info));
            let at = usize::from(id);
            if table.by_id.len() <= at {
                table.by_id.resize(at + 1, None);
            }
            if let Some(slot) = table.by_id.get_mut(at) {
                *slot = Some(Arc::clone(&info));
            }
        }
        info
    }

    /// A tool by the id it was given (in this configuration, or in another of the same
    /// engine's, whose decision is then made here under this configuration).
    pub fn tool_by_id(&self, id: u16) -> Option<Arc<ToolInfo>> {
        let key = u64::from(id);
        let found =
            RECENT_BY_ID.with(|cell| cell.try_borrow().ok()?.find(self.table, key, |_| true));
        if let Some(info) = found {
            return Some(info);
        }
        let info = self.tool_by_id_in_table(id)?;
        if info.id == id {
            RECENT_BY_ID.with(|cell| {
                if let Ok(mut recent) = cell.try_borrow_mut() {
                    recent.keep(self.table, key, &info);
                }
            });
        }
        Some(info)
    }

    /// [`CompiledRules::tool_by_id`] from the table.
    fn tool_by_id_in_table(&self, id: u16) -> Option<Arc<ToolInfo>> {
        {
            let table = self.tools.read().unwrap_or_else(|e| e.into_inner());
            if let Some(Some(info)) = table.by_id.get(usize::from(id)) {
                return Some(Arc::clone(info));
            }
        }
        let name = {
            let ids = self.ids.read().unwrap_or_else(|e| e.into_inner());
            ids.by_name
                .iter()
                .find(|(_, i)| **i == id)
                .map(|(n, _)| n.clone())
        }?;
        Some(self.tool(&name))
    }

    fn describe(&self, id: u16, name: &str) -> ToolInfo {
        let c = &self.config;
        let lookup = if c.fingerprint.case_insensitive_tools {
            name.to_lowercase()
        } else {
            name.to_owned()
        };
        let placement = c.place_tool(&lookup);
        let category = placement
            .category
            .and_then(|cat| c.categories.iter().position(|x| std::ptr::eq(x, cat)));
        let exempt = placement.setting.map_or(0, |t| {
            t.exempt
                .iter()
                .filter_map(|d| Detector::named(d))
                .fold(0u16, |bits, d| bits | (1 << d as u16))
        });
        let watched = placement.enabled();
        let det = self.detectors(category);
        let known_tools = &det.unknown_tool.known_tools;
        let tests = det.test_fix.test_tools.iter().any(|g| g.is_match(&lookup));
        ToolInfo {
            id,
            name: name.into(),
            category,
            keys: self.fingerprint.tool_keys(c, name),
            known: known_tools.is_empty() || known_tools.iter().any(|g| g.is_match(&lookup)),
            modifies: category
                .and_then(|i| c.categories.get(i))
                .is_some_and(|cat| cat.modifies),
            waits: category
                .and_then(|i| c.categories.get(i))
                .is_some_and(|cat| cat.waits),
            tests,
            watched,
            exempt,
        }
    }

    /// The ladder for a detector of a category: the detector's, else the category's, else the
    /// policy's. Returns the ladder's name too.
    pub fn ladder<'a>(
        &'a self,
        category: Option<usize>,
        detector_ladder: Option<&'a str>,
    ) -> (&'a str, Option<&'a Ladder>) {
        let cat = category.and_then(|i| self.config.categories.get(i));
        let name = detector_ladder
            .or_else(|| cat.and_then(|c| c.ladder.as_deref()))
            .unwrap_or(self.config.ladder.as_str());
        match self.config.ladders.get(name) {
            Some(l) => (name, Some(l)),
            None => {
                let fallback = self.config.ladder.as_str();
                (fallback, self.config.ladders.get(fallback))
            }
        }
    }
}
