//! Unit and property tests of the objective lifecycle.
use super::*;
use proptest::prelude::*;

fn new_obj(watchers: &[&str]) -> (Objective, Vec<ObjectiveEvent>) {
    create(
        NewObjective {
            id: "obj-1".into(),
            title: " Build the widget ".into(),
            outcome: "Widget builds and tests pass".into(),
            body: "Details here".into(),
            assignee: "builder".into(),
            originator: "director".into(),
            watchers: watchers.iter().map(|s| (*s).to_owned()).collect(),
            attachments: vec![],
        },
        100,
    )
    .unwrap()
}

#[test]
fn create_emits_assigned_then_watchers() {
    let (obj, events) = new_obj(&["reviewer", "builder", "reviewer", "director"]);
    assert_eq!(obj.title, "Build the widget");
    assert_eq!(obj.watchers, vec!["reviewer"]);
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![EventKind::Assigned, EventKind::WatcherAdded]);
    assert_eq!(
        Value::Object(events[0].payload.clone()),
        json!({"title":"Build the widget","outcome":"Widget builds and tests pass","assignee":"builder","watchers":["reviewer"]})
    );
    assert_eq!(
        lifecycle_body(&obj, &events[0]),
        "[objective assigned] obj-1\ntitle:      Build the widget\noutcome:    Widget builds and tests pass\nassignee:   builder\noriginator: director\nstatus:     active\nbody:       Details here"
    );
    assert_eq!(
        lifecycle_body(&obj, &events[1]),
        "[objective watcher_added] obj-1\ntitle:    Build the widget\noutcome:  Widget builds and tests pass\nwatcher:  reviewer\nstatus:   active"
    );
    let (_, plain) = new_obj(&[]);
    assert!(!plain[0].payload.contains_key("watchers"));
}

#[test]
fn block_unblock_complete() {
    let (mut obj, _) = new_obj(&[]);
    let err = apply(
        &mut obj,
        "builder",
        Change::Update {
            status: Some(Status::Blocked),
            block_reason: None,
        },
        1,
    )
    .unwrap_err();
    assert_eq!(err.status(), 400);
    let ev = apply(
        &mut obj,
        "builder",
        Change::Update {
            status: Some(Status::Blocked),
            block_reason: Some(" waiting on API keys ".into()),
        },
        200,
    )
    .unwrap();
    assert_eq!(obj.status, Status::Blocked);
    assert_eq!(obj.block_reason.as_deref(), Some("waiting on API keys"));
    assert_eq!(
        lifecycle_body(&obj, &ev[0]),
        "[objective blocked] obj-1\ntitle:    Build the widget\nassignee: builder\nreason:   waiting on API keys"
    );
    // reason edit while blocked: silent
    let ev = apply(
        &mut obj,
        "builder",
        Change::Update {
            status: None,
            block_reason: Some("other".into()),
        },
        250,
    )
    .unwrap();
    assert!(ev.is_empty());
    assert_eq!(obj.block_reason.as_deref(), Some("other"));
    assert_eq!(obj.updated_at, 250);
    let ev = apply(
        &mut obj,
        "builder",
        Change::Update {
            status: Some(Status::Active),
            block_reason: None,
        },
        300,
    )
    .unwrap();
    assert_eq!(ev[0].kind, EventKind::Unblocked);
    assert_eq!(obj.block_reason, None);
    // same status: no-op
    let before = obj.clone();
    assert!(
        apply(
            &mut obj,
            "builder",
            Change::Update {
                status: Some(Status::Active),
                block_reason: None
            },
            400
        )
        .unwrap()
        .is_empty()
    );
    assert_eq!(obj, before);
    let ev = apply(
        &mut obj,
        "builder",
        Change::Complete {
            result: "shipped".into(),
        },
        500,
    )
    .unwrap();
    assert_eq!(obj.status, Status::Done);
    assert_eq!(obj.completed_at, Some(500));
    assert_eq!(lifecycle_data(&obj, &ev[0])["objective_status"], "done");
    let err = apply(
        &mut obj,
        "builder",
        Change::Complete {
            result: "again".into(),
        },
        600,
    )
    .unwrap_err();
    assert_eq!(
        err,
        TransitionError::Conflict("objective obj-1 is already done".into())
    );
    let err = apply(
        &mut obj,
        "x",
        Change::Update {
            status: Some(Status::Blocked),
            block_reason: Some("r".into()),
        },
        1,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "objective obj-1 is done and cannot be updated"
    );
    // watchers still editable on a terminal objective
    let ev = apply(
        &mut obj,
        "director",
        Change::Watchers {
            add: vec!["qa".into()],
            remove: vec![],
        },
        700,
    )
    .unwrap();
    assert_eq!(ev.len(), 1);
}

#[test]
fn cancel_keeps_block_reason_and_reassign_rules() {
    let (mut obj, _) = new_obj(&[]);
    apply(
        &mut obj,
        "builder",
        Change::Update {
            status: Some(Status::Blocked),
            block_reason: Some("r".into()),
        },
        1,
    )
    .unwrap();
    let ev = apply(
        &mut obj,
        "director",
        Change::Cancel {
            reason: Some("  ".into()),
        },
        2,
    )
    .unwrap();
    assert!(ev[0].payload.is_empty());
    assert_eq!(obj.block_reason.as_deref(), Some("r"));
    assert_eq!(
        lifecycle_body(&obj, &ev[0]),
        "[objective cancelled] obj-1\ntitle:    Build the widget\nassignee: builder\nreason:   (no reason given)"
    );
    let err = apply(
        &mut obj,
        "director",
        Change::Reassign {
            to: "x".into(),
            note: None,
        },
        3,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "objective obj-1 is cancelled and cannot be reassigned"
    );

    let (mut obj, _) = new_obj(&[]);
    let err = apply(
        &mut obj,
        "d",
        Change::Reassign {
            to: "builder".into(),
            note: None,
        },
        3,
    )
    .unwrap_err();
    assert_eq!(err.status(), 400);
    let ev = apply(
        &mut obj,
        "director",
        Change::Reassign {
            to: "reviewer".into(),
            note: Some("busy".into()),
        },
        4,
    )
    .unwrap();
    assert_eq!(
        Value::Object(ev[0].payload.clone()),
        json!({"from":"builder","to":"reviewer","note":"busy"})
    );
    let rec = event_recipients(&obj, &ev[0], ["boss"]);
    assert_eq!(
        rec.into_iter().collect::<Vec<_>>(),
        vec!["boss", "builder", "director", "reviewer"]
    );
    assert_eq!(
        lifecycle_body(&obj, &ev[0]),
        "[objective reassigned] obj-1\ntitle:   Build the widget\noutcome: Widget builds and tests pass\nfrom:    builder\nto:      reviewer"
    );
}

#[test]
fn watchers_skip_and_removed_watcher_still_hears() {
    let (mut obj, _) = new_obj(&["qa"]);
    let ev = apply(
        &mut obj,
        "director",
        Change::Watchers {
            add: vec!["qa".into(), "builder".into(), "scout".into()],
            remove: vec!["nobody".into()],
        },
        5,
    )
    .unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(obj.watchers, vec!["qa", "scout"]);
    let ev = apply(
        &mut obj,
        "director",
        Change::Watchers {
            add: vec![],
            remove: vec!["scout".into()],
        },
        6,
    )
    .unwrap();
    assert!(event_recipients(&obj, &ev[0], []).contains("scout"));
    assert_eq!(
        lifecycle_body(&obj, &ev[0]),
        "[objective watcher_removed] obj-1\ntitle:   Build the widget\nwatcher: scout"
    );
}

#[test]
fn authority() {
    let (obj, _) = new_obj(&["qa"]);
    let none = PermissionSet::EMPTY;
    assert!(authorize(&obj, "builder", none, Action::Complete).is_ok());
    assert!(authorize(&obj, "director", PermissionSet::all(), Action::Complete).is_err());
    assert!(authorize(&obj, "qa", none, Action::View).is_ok());
    assert!(authorize(&obj, "qa", none, Action::Update).is_err());
    assert!(authorize(&obj, "director", none, Action::Cancel).is_ok());
    assert!(authorize(&obj, "stranger", none, Action::View).is_err());
    let create: PermissionSet = [Permission::ObjectivesCreate].into_iter().collect();
    assert!(authorize(&obj, "stranger", create, Action::View).is_ok());
    let manage: PermissionSet = [Permission::MembersManage].into_iter().collect();
    assert!(authorize(&obj, "admin", manage, Action::Discuss).is_ok());
    assert!(authorize(&obj, "admin", manage, Action::View).is_ok());
    assert_eq!(
        authorize(&obj, "stranger", none, Action::Discuss)
            .unwrap_err()
            .0,
        "user 'stranger' is not a member of objective obj-1's thread"
    );
    assert!(authorize(&obj, "director", none, Action::Watchers).is_ok());
    assert!(authorize(&obj, "builder", none, Action::Reassign).is_err());
}

#[test]
fn ids() {
    assert_eq!(format_id(0, 1), "obj-0-1");
    assert_eq!(format_id(36, 36), "obj-10-10");
}

fn change() -> impl Strategy<Value = Change> {
    let name = proptest::sample::select(vec!["builder", "director", "qa", "scout"])
        .prop_map(str::to_owned);
    prop_oneof![
        (
            proptest::option::of(proptest::sample::select(vec![
                Status::Active,
                Status::Blocked
            ])),
            proptest::option::of("[a-c ]{0,3}")
        )
            .prop_map(|(status, block_reason)| Change::Update {
                status,
                block_reason
            }),
        "[a-c ]{0,3}".prop_map(|result| Change::Complete { result }),
        proptest::option::of("[a-c]{0,2}").prop_map(|reason| Change::Cancel { reason }),
        (name.clone(), proptest::option::of("[a-c]{0,2}"))
            .prop_map(|(to, note)| Change::Reassign { to, note }),
        (
            proptest::collection::vec(name.clone(), 0..3),
            proptest::collection::vec(name, 0..3)
        )
            .prop_map(|(add, remove)| Change::Watchers { add, remove }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../proptest-regressions/objective.txt"),
        ))),
        ..ProptestConfig::default()
    })]

    /// Invariants over any sequence of changes: terminal states are final,
    /// blockReason is set exactly while blocked (or kept by cancel), watchers never
    /// hold the assignee at creation or duplicates, every event bumps updatedAt,
    /// and a failed change leaves the objective untouched.
    #[test]
    fn lifecycle_invariants(changes in proptest::collection::vec(change(), 0..12)) {
        let (mut obj, _) = new_obj(&["qa"]);
        for (i, c) in changes.into_iter().enumerate() {
            let now = 1000 + i as i64;
            let before = obj.clone();
            match apply(&mut obj, "director", c, now) {
                Ok(events) => {
                    if before.status.is_terminal() {
                        prop_assert_eq!(obj.status, before.status);
                    }
                    if !events.is_empty() {
                        prop_assert_eq!(obj.updated_at, now);
                    }
                    if events.is_empty() && obj.updated_at != now {
                        prop_assert_eq!(&obj, &before);
                    }
                }
                Err(_) => prop_assert_eq!(&obj, &before),
            }
            match obj.status {
                Status::Blocked => prop_assert!(obj.block_reason.is_some()),
                Status::Active | Status::Done => prop_assert!(obj.block_reason.is_none()),
                Status::Cancelled => {}
            }
            prop_assert_eq!(obj.completed_at.is_some(), obj.status == Status::Done);
            let unique: BTreeSet<_> = obj.watchers.iter().collect();
            prop_assert_eq!(unique.len(), obj.watchers.len());
        }
    }
}
