//! Summary sections (DeerMem v2): per user, shared by the user's agents. A section is rewritten as a
//! whole by extraction or import; its update time says when.

use sea_orm::{ActiveModelTrait, ActiveValue::Set, ConnectionTrait, EntityTrait};

use crate::store::entity::profiles;
use crate::store::{StoreError, now_ms};

/// The six sections, in render order, with DeerMem's JSON names and their injected labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    WorkContext,
    PersonalContext,
    TopOfMind,
    RecentMonths,
    EarlierContext,
    LongTermBackground,
}

impl Section {
    pub const ALL: [Section; 6] = [
        Section::WorkContext,
        Section::PersonalContext,
        Section::TopOfMind,
        Section::RecentMonths,
        Section::EarlierContext,
        Section::LongTermBackground,
    ];

    /// The key in DeerFlow's memory.json and in the extraction answer.
    pub fn json_name(self) -> &'static str {
        match self {
            Section::WorkContext => "workContext",
            Section::PersonalContext => "personalContext",
            Section::TopOfMind => "topOfMind",
            Section::RecentMonths => "recentMonths",
            Section::EarlierContext => "earlierContext",
            Section::LongTermBackground => "longTermBackground",
        }
    }

    /// `user` or `history` in memory.json.
    pub fn group(self) -> &'static str {
        match self {
            Section::WorkContext | Section::PersonalContext | Section::TopOfMind => "user",
            _ => "history",
        }
    }

    /// The label in the injected block.
    pub fn label(self) -> &'static str {
        match self {
            Section::WorkContext => "Work",
            Section::PersonalContext => "Personal",
            Section::TopOfMind => "Current Focus",
            Section::RecentMonths => "Recent",
            Section::EarlierContext => "Earlier",
            Section::LongTermBackground => "Background",
        }
    }

    pub fn from_json_name(name: &str) -> Option<Section> {
        Section::ALL.into_iter().find(|s| s.json_name() == name)
    }
}

/// A user's sections as stored; the default (all empty, revision 0) when nothing is known yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub sections: [(String, Option<i64>); 6],
    pub revision: i64,
    pub updated_at: Option<i64>,
}

impl Profile {
    pub fn get(&self, section: Section) -> &(String, Option<i64>) {
        &self.sections[section as usize]
    }
}

impl From<profiles::Model> for Profile {
    fn from(m: profiles::Model) -> Self {
        Profile {
            sections: [
                (m.work_context, m.work_context_at),
                (m.personal_context, m.personal_context_at),
                (m.top_of_mind, m.top_of_mind_at),
                (m.recent_months, m.recent_months_at),
                (m.earlier_context, m.earlier_context_at),
                (m.long_term_background, m.long_term_background_at),
            ],
            revision: m.revision,
            updated_at: Some(m.updated_at),
        }
    }
}

pub async fn load(db: &impl ConnectionTrait, user: &str) -> Result<Profile, StoreError> {
    Ok(profiles::Entity::find_by_id(user.to_owned()).one(db).await?.map(Profile::from).unwrap_or_default())
}

/// Rewrites the given sections (text, time; None time = now); returns how many changed.
pub async fn write(db: &impl ConnectionTrait, user: &str, changes: &[(Section, String, Option<i64>)]) -> Result<u32, StoreError> {
    let now = now_ms();
    let existing = profiles::Entity::find_by_id(user.to_owned()).one(db).await?;
    let mut current = existing.clone().map(Profile::from).unwrap_or_default();
    let mut changed = 0;
    for (section, text, at) in changes {
        let slot = &mut current.sections[*section as usize];
        if slot.0 != *text {
            *slot = (text.clone(), Some(at.unwrap_or(now)));
            changed += 1;
        }
    }
    if changed == 0 {
        return Ok(0);
    }
    let [work, personal, top, recent, earlier, background] = current.sections;
    let mut row = profiles::ActiveModel {
        user_id: Set(user.to_owned()),
        work_context: Set(work.0),
        work_context_at: Set(work.1),
        personal_context: Set(personal.0),
        personal_context_at: Set(personal.1),
        top_of_mind: Set(top.0),
        top_of_mind_at: Set(top.1),
        recent_months: Set(recent.0),
        recent_months_at: Set(recent.1),
        earlier_context: Set(earlier.0),
        earlier_context_at: Set(earlier.1),
        long_term_background: Set(background.0),
        long_term_background_at: Set(background.1),
        revision: Set(current.revision + 1),
        updated_at: Set(now),
    };
    if existing.is_some() {
        row.user_id = sea_orm::ActiveValue::Unchanged(user.to_owned());
        row.update(db).await?;
    } else {
        profiles::Entity::insert(row).exec_without_returning(db).await?;
    }
    Ok(changed)
}
