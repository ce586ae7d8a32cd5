"""Does each worker image exist in its registry? Asked with the caller's credentials, reading
nothing but the manifest's headers:

- any registry: the OCI Distribution API (opencontainers/distribution-spec, spec.md, "Pulling
  manifests": `HEAD /v2/<name>/manifests/<reference>`, 200 when it exists, 404 when not),
  after the registry's token challenge (`WWW-Authenticate: Bearer realm=...,service=...,
  scope=...`, Docker "Token Authentication Specification"). Artifact Registry
  (`*-docker.pkg.dev`) and Container Registry (`gcr.io`) take the caller's Google access
  token as the password of user `oauth2accesstoken` (Artifact Registry, "Configure
  authentication to Artifact Registry for Docker": access token);
- Amazon ECR (`ACCOUNT.dkr.ecr.REGION.amazonaws.com`): boto3's ECR `DescribeImages` for the
  tag or digest (the caller needs `ecr:DescribeImages`).

It cannot see whether the identity that pulls may read the image: the GKE node pool's service
account, the Vertex AI Service Agent, the TPU VM's service account, an EKS node role or
image_pull_secrets. Each check says so ("pull access not checked").

Registries on 127.0.0.1 or localhost are spoken to over HTTP, as Docker treats them as
insecure by default; every other over HTTPS.
"""
from __future__ import annotations

import re

from tasks.config import RunConfig
from tasks.provision import google_rest
from tasks.provision.bucket_access import aws_credentials
from tasks.provision.preflight import DOCS, Check, not_checked

AREA = "image"
# Manifest media types a HEAD must accept, or a registry may answer 404 for an index it holds
# (OCI image-spec: image manifest and index; Docker's schema 2 manifest and list).
ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"))
DOCKER_HUB = {"docker.io": "registry-1.docker.io"}  # the name and the API host of Docker Hub
GOOGLE_HOSTS = re.compile(r"(^|\.)(gcr\.io|[a-z0-9-]+-docker\.pkg\.dev)$")
ECR_HOST = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def parse(image: str) -> tuple[str, str, str]:
    """(registry host, repository, tag or digest), as docker reads a reference: the first
    component is a host when it has a dot or a port or is localhost; else no host ("")."""
    rest, digest = (image.split("@", 1) + [""])[:2]
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        host, path = first, remainder
    else:
        host, path = "", rest
    name, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    return host, name, digest or tag or "latest"


def checks(cfg: RunConfig, images: dict[str, str], puller: str) -> list[Check]:
    """`images`: image -> what runs it (e.g. "train, evaluate"); `puller`: who pulls it on
    this backend, named in the pull-access line."""
    found = [exists(cfg, image, used_by) for image, used_by in images.items()]
    if images:
        found.append(not_checked(AREA, "pull access to the worker image(s)", (
            f"{puller} pulls them, with credentials preflight does not hold; grant it read "
            f"access to the repository (Artifact Registry: roles/artifactregistry.reader); "
            f"{DOCS}")))
    return found


def exists(cfg: RunConfig, image: str, used_by: str) -> Check:
    what = f"{image} exists ({used_by})"
    host, name, reference = parse(image)
    if not host:  # bertflow's default without image_registry: a name the nodes hold
        return not_checked(AREA, what, (
            "a name without a registry, which the nodes must already hold (kind load, "
            "minikube image load); set image_registry or worker_image to a registry to check "
            "it"))
    ecr = ECR_HOST.match(host)
    try:
        if ecr:
            status = _ecr_status(cfg, ecr[1], ecr[2], name, reference)
        else:
            status = _manifest_status(cfg, host, name, reference)
    except Exception as err:  # noqa: BLE001 (unreachable registry, no credentials)
        return not_checked(AREA, what, f"registry {host} did not answer: "
                                       f"{type(err).__name__}: {str(err)[:200]}")
    if status == 200:
        return Check(AREA, what, True)
    if status == 404:
        return Check(AREA, what, False, (
            f"Image: {image} is not in registry {host} (no manifest {reference} in "
            f"repository {name}); check worker_image / image_registry, or build and push it "
            f"(docker/Dockerfile.trainer-KIND: docker build, docker push)"))
    return not_checked(AREA, what, (
        f"registry {host} refused the caller ({status}); grant the caller read access to "
        f"{name} (Artifact Registry: roles/artifactregistry.reader) to check it"))


def _manifest_status(cfg: RunConfig, host: str, name: str, reference: str) -> int:
    import requests

    scheme = "http" if host.split(":")[0] in ("127.0.0.1", "localhost") else "https"
    url = f"{scheme}://{DOCKER_HUB.get(host, host)}/v2/{name}/manifests/{reference}"
    headers = {"Accept": ACCEPT}
    resp = requests.head(url, headers=headers, timeout=30)
    challenge = resp.headers.get("WWW-Authenticate", "")
    if resp.status_code != 401 or not challenge:
        return resp.status_code
    login = _google_login(cfg) if GOOGLE_HOSTS.search(host.split(":")[0]) else None
    kind = challenge.split(" ", 1)[0].lower()
    if kind == "basic":
        if login is None:
            return 401
        return requests.head(url, headers=headers, auth=login, timeout=30).status_code
    params = dict(_CHALLENGE.findall(challenge))
    realm = params.pop("realm", "")
    params.setdefault("scope", f"repository:{name}:pull")
    token = requests.get(realm, params=params, auth=login, timeout=30)
    if token.status_code != 200:
        return token.status_code
    body = token.json()
    bearer = body.get("token") or body.get("access_token") or ""
    return requests.head(url, headers={**headers, "Authorization": f"Bearer {bearer}"},
                         timeout=30).status_code


def _google_login(cfg: RunConfig) -> tuple[str, str] | None:
    """("oauth2accesstoken", the caller's access token), or None without Google credentials."""
    try:
        from google.auth.transport.requests import Request

        found = google_rest.credentials(cfg)
        found.refresh(Request())
        return "oauth2accesstoken", found.token
    except Exception:  # noqa: BLE001 (no Google credentials: ask anonymously)
        return None


def _ecr_status(cfg: RunConfig, account: str, region: str, name: str, reference: str) -> int:
    import boto3
    from botocore.exceptions import ClientError

    image_id = ({"imageDigest": reference} if reference.startswith("sha256:")
                else {"imageTag": reference})
    ecr = boto3.session.Session().client("ecr", region_name=region,
                                         **aws_credentials(cfg))
    try:
        ecr.describe_images(registryId=account, repositoryName=name, imageIds=[image_id])
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return 404
        if code in ("AccessDeniedException", "AccessDenied"):
            return 403
        raise
    return 200
