use super::*;

#[test]
fn floating_references_are_refused_unless_allowed() {
    let hex = "294b01e1796a8acede4619f32a1c394fae1f8021e57986ea01aad38dc2a4f502";
    assert!(check_pinned(&format!("rabbitmq:4.1.4-management@sha256:{hex}"), false).is_ok());
    assert!(check_pinned("rabbitmq:latest", false)
        .unwrap_err()
        .to_string()
        .contains("not pinned by digest"));
    assert!(check_pinned("rabbitmq@sha256:abc", false).is_err());
    assert!(check_pinned("rabbitmq:latest", true).is_ok());
}

#[test]
fn references_round_trip_through_generic_image() {
    use testcontainers::Image;
    let hex = "67f41722b7a8cbdb868a44a4995c846eddfdc2973bccb291ce937dce88ad5675";
    for r in [
        format!("postgres:17@sha256:{hex}"),
        format!("localhost/mqlab-postgres@sha256:{hex}"),
        "localhost:5000/x/rabbitmq:3.10".to_string(),
    ] {
        let g = generic_image(&r);
        assert_eq!(format!("{}:{}", g.name(), g.tag()), r);
    }
}
