"""The chart's catalogue values (`catalogue.*`): the databases the engine and the gateway
serve by name reach both of them: PostgreSQL DSNs only through a Secret (a mounted file),
SQLite and Spider volumes mounted read-only, nothing when nothing is named, and a mistyped
key fails naming it."""

from __future__ import annotations

import base64

import pytest
import yaml

from tests.deploy_helpers import IMAGE, component_of, containers, render

from services.deploy.chart import ChartValuesError, render_chart  # noqa: E402

DSN = "postgresql://reader:cat-pw-5d41402abc@pg.example:5432/sales"
SET_ALL = (
    f"catalogue.postgres.dsns.sales={DSN}",
    "catalogue.sqlite.claimName=sqlite-dbs",
    "catalogue.sqlite.roots={.,team}",
    "catalogue.spider.claimName=spider-data",
    "catalogue.spider.path=spider",
)
MOUNTS = {"catalogue-sqlite": "/catalogue/sqlite", "catalogue-spider": "/catalogue/spider"}


def _serving(objects) -> list[tuple[str, dict, dict]]:
    """(who, pod spec, container) of the gateway container and both Ray pod groups' containers."""
    out = []
    for obj in objects:
        if (obj.kind == "Deployment" and component_of(obj) == "gateway") or obj.kind == "RayService":
            out += [(f"{obj.ref} {c['name']}", spec, c) for spec, c in containers(obj)]
    return out


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_serving_pods_are_the_gateway_and_both_ray_groups():
    names = sorted(c["name"] for _, _, c in _serving(render(SET_ALL)))
    assert names == ["gateway", "ray-head", "ray-worker"]


def test_a_dsn_appears_only_in_a_secret_and_reaches_every_server_as_a_file():
    objects = render(SET_ALL)
    outside = [o.ref for o in objects if o.kind != "Secret" and "cat-pw-5d41402abc" in yaml.safe_dump(o.obj)]
    assert outside == []
    secret, = [o for o in objects if o.kind == "Secret" and o.obj["metadata"]["name"].endswith("-catalogue-postgres")]
    assert base64.b64decode(secret.obj["data"]["postgres"]).decode() == f"sales={DSN}\n"
    for who, spec, container in _serving(objects):
        env = _env(container)
        path = env["HEADSTART_CATALOGUE_POSTGRES_FILE"]["value"]
        assert "HEADSTART_CATALOGUE_POSTGRES" not in env, who  # never a literal
        mount, = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        assert mount.get("readOnly") is True, who
        volume, = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == secret.obj["metadata"]["name"], who
        assert path.rsplit("/", 1)[-1] in [i["path"] for i in volume["secret"]["items"]], who


def test_the_mounted_file_is_what_the_catalogue_reads(tmp_path):
    from headstart.schema.catalogue import Catalogue

    secret, = [o for o in render(SET_ALL) if o.kind == "Secret" and "postgres" in o.obj.get("data", {})]
    (tmp_path / "postgres").write_bytes(base64.b64decode(secret.obj["data"]["postgres"]))
    catalogue = Catalogue.from_env(tmp_path / "no-spider", environ={
        "HEADSTART_CATALOGUE_POSTGRES_FILE": str(tmp_path / "postgres")})
    assert catalogue.entry("sales").spec == DSN


def test_an_existing_secret_is_used_and_no_secret_is_made():
    objects = render(("catalogue.postgres.existingSecret=my-dsns", f"catalogue.postgres.dsns.sales={DSN}"))
    assert not [o for o in objects if o.kind == "Secret" and "catalogue" in o.obj["metadata"]["name"]]
    for who, spec, container in _serving(objects):
        assert "HEADSTART_CATALOGUE_POSTGRES_FILE" in _env(container), who
        assert [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "my-dsns"], who
        assert DSN not in yaml.safe_dump(container), who


def test_sqlite_and_spider_volumes_are_mounted_read_only_with_their_paths():
    for who, spec, container in _serving(render(SET_ALL)):
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for name, path in MOUNTS.items():
            assert mounts[name]["mountPath"] == path and mounts[name]["readOnly"] is True, who
            assert volumes[name]["persistentVolumeClaim"]["readOnly"] is True, who
        assert volumes["catalogue-sqlite"]["persistentVolumeClaim"]["claimName"] == "sqlite-dbs"
        assert volumes["catalogue-spider"]["persistentVolumeClaim"]["claimName"] == "spider-data"
        env = _env(container)
        assert env["HEADSTART_CATALOGUE_SQLITE_ROOTS"]["value"] == "/catalogue/sqlite:/catalogue/sqlite/team", who
        assert env["HEADSTART_SPIDER_DIR"]["value"] == "/catalogue/spider/spider", who
        if container["name"] == "gateway":  # GatewaySettings.spider_dir
            assert env["HEADSTART_GATEWAY_SPIDER_DIR"]["value"] == "/catalogue/spider/spider", who


@pytest.mark.parametrize("sets", [(), ("catalogue.sqlite.roots={a,b}", "catalogue.spider.path=x")])
def test_nothing_named_means_no_catalogue_volume_env_or_secret(sets):
    objects = render(sets)
    assert not [o for o in objects if o.kind == "Secret" and "catalogue" in o.obj["metadata"]["name"]]
    for who, spec, container in _serving(objects):
        assert not [v for v in spec["volumes"] if v["name"].startswith("catalogue-")], who
        assert not [m for m in container["volumeMounts"] if m["name"].startswith("catalogue-")], who
        assert not [n for n in _env(container) if "CATALOGUE" in n or "SPIDER" in n], who


def test_only_the_named_source_is_mounted():
    for who, spec, container in _serving(render(("catalogue.sqlite.claimName=sqlite-dbs",))):
        assert {v["name"] for v in spec["volumes"] if v["name"].startswith("catalogue-")} == {"catalogue-sqlite"}, who
        assert "HEADSTART_SPIDER_DIR" not in _env(container), who


def test_catalogue_changes_restart_the_servers():
    def checksums(sets):
        return [t["metadata"]["annotations"]["checksum/catalogue"] for o in render(sets)
                if (o.kind == "Deployment" and component_of(o) == "gateway") or o.kind == "RayService"
                for t in ([o.obj["spec"]["template"]] if o.kind == "Deployment" else
                          [o.obj["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]]
                          + [g["template"] for g in o.obj["spec"]["rayClusterConfig"]["workerGroupSpecs"]])]
    before, after = checksums(()), checksums(("catalogue.sqlite.claimName=sqlite-dbs",))
    assert len(before) == 3 and all(a != b for a, b in zip(before, after))


@pytest.mark.parametrize("sets, words", [
    (("catalogue.sqlite.claim=dbs",), ["/catalogue/sqlite", "claim"]),
    (("catalogue.spyder.claimName=x",), ["/catalogue", "spyder"]),
    (("catalogue.postgres.dsn.sales=postgresql://h/db",), ["/catalogue/postgres", "dsn"]),
    (("catalogue.postgres.dsns.sales=1",), ["/catalogue/postgres/dsns/sales", "string"]),
    (("catalogue.postgres.dsns.bad\\ alias=postgresql://h/db",), ["bad alias"]),
    (("catalogue.sqlite.roots=team",), ["/catalogue/sqlite/roots", "array"]),
    (("catalogue.sqlite.roots={../etc}",), ["/catalogue/sqlite/roots/0"]),
    (("catalogue.sqlite.roots={}",), ["/catalogue/sqlite/roots"]),
    (("catalogue.spider.path=../../etc",), ["/catalogue/spider/path"]),
    (("catalogue.spider.claimName=true",), ["/catalogue/spider/claimName", "string"]),
])
def test_a_mistyped_catalogue_key_fails_naming_it(sets, words):
    with pytest.raises(ChartValuesError) as err:
        render_chart(sets=(IMAGE, *sets))
    for word in words:
        assert word in str(err.value)


def test_no_server_means_no_catalogue_secret():
    objects = render(("gateway.enabled=false", "engine.enabled=false", f"catalogue.postgres.dsns.sales={DSN}"))
    assert not [o for o in objects if o.kind == "Secret" and "catalogue" in o.obj["metadata"]["name"]]
