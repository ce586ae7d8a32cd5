"""May the workers' identity read the data and write the artifact root? Asked of each bucket
from the caller's side, without the workers' credentials and without writing anything:

- Cloud Storage, a Google service account the caller may impersonate: the account's own
  answer (tasks/provision/gcs_impersonation.py: a short-lived token, then Cloud Storage
  testIamPermissions), which counts every grant the account holds;
- Cloud Storage otherwise (a service account, or a GKE Workload Identity principal): the
  bucket's IAM policy (tasks/provision/gcs_policy.py). It cannot see grants on the project,
  folder or organization (inherited), deny policies or VPC Service Controls; a binding with
  an IAM condition or a custom role is evaluated by IAM at request time: those are reported
  "not checked", never passed.
- Amazon S3, an IAM role (EKS IRSA): IAM `SimulatePrincipalPolicy` for the role and the S3
  actions the storage layer calls (boto3's IAM client; it evaluates the role's policies, its
  permissions boundary and the organization's SCPs). The caller needs
  `iam:SimulatePrincipalPolicy`. It cannot see the bucket's own policy or S3 Access Points.
"""
from __future__ import annotations

from dataclasses import dataclass

from tasks.config import RunConfig
from tasks.errors import StorageError
from tasks.io import storage
from tasks.io.cloud_storage import split
from tasks.provision import gcs_impersonation, gcs_policy
from tasks.provision.preflight import DOCS, OBJECT_ROLE, Check, not_checked

AREA = "workers"
# Cloud Storage permissions of the object calls the steps make: see gcs_policy.
READ = gcs_policy.READ
WRITE = gcs_policy.WRITE
# The S3 actions of tasks/io/cloud_storage.py's S3Store (Amazon S3 User Guide, "Policy
# actions for Amazon S3"): objects read and written, the bucket listed.
S3_READ = ("s3:GetObject",)
S3_WRITE = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
S3_LIST = "s3:ListBucket"


@dataclass
class Place:
    label: str  # "artifact_root", "export_uri", or the data field: "train_uri", ...
    uri: str
    write: bool


def places(cfg: RunConfig, scheme: str, only: tuple[str, ...] = ()) -> list[Place]:
    """The cloud folders of `scheme` the workers read (the data) and write (artifact root,
    exports); `only`: these labels (a backend whose workers run some steps only). Templated
    parts ({ds}) stay: only the bucket matters here."""
    found = [Place("artifact_root", cfg.artifact_root, True),
             Place("export_uri", cfg.resolved_export_uri(), True),
             Place("train_uri", cfg.train_uri, False)]
    for label in ("validation_uri", "test_uri", "eval_uri"):
        if getattr(cfg, label):
            found.append(Place(label, getattr(cfg, label), False))
    return [p for p in found if storage.scheme_of(p.uri) == scheme
            and (not only or p.label in only) and "{" not in split(p.uri)[0]]


# --- Cloud Storage -----------------------------------------------------------------------
def gcs_checks(cfg: RunConfig, members: list[str], who: str, only: tuple[str, ...] = (),
               account: str = "") -> list[Check]:
    """`members`: the workers' identity as IAM policies name it (`serviceAccount:EMAIL`,
    `principal://...`; `*` matches a part preflight cannot know, such as a project number),
    the first one the one to grant; `who` names it for the user, with the field it comes
    from; `account`: the Google service account's email, asked itself where the caller may
    impersonate it."""
    needs: dict[str, tuple[set[str], list[Place]]] = {}
    for place in places(cfg, "gs", only):
        bucket = split(place.uri)[0]
        perms, where = needs.setdefault(bucket, (set(), []))
        perms.update(WRITE if place.write else READ)
        where.append(place)
    return [_bucket_check(cfg, bucket, members, who, perms, where, account)
            for bucket, (perms, where) in needs.items()]


def _bucket_check(cfg: RunConfig, bucket: str, members: list[str], who: str, need: set[str],
                  where: list[Place], account: str) -> Check:
    verb = "read and write" if any(p.write for p in where) else "read"
    labels = ", ".join(p.label for p in where)
    what = f"{who} may {verb} gs://{bucket} ({labels})"
    role = OBJECT_ROLE if verb != "read" else "roles/storage.objectViewer"
    if account:  # the account's own answer, where the caller may impersonate it
        lacks = gcs_impersonation.lacking(cfg, account, bucket, need)
        if lacks == []:
            return Check(AREA, what, True, "asked as the account itself (impersonated)")
        if lacks:
            return Check(AREA, what, False, (
                f"Workers: {who} cannot {verb} gs://{bucket} ({labels}): asked as the "
                f"account itself (impersonated), Cloud Storage grants it no "
                f"{', '.join(lacks)} (grant it {role} on bucket {bucket}; {DOCS})"))
    verdict = gcs_policy.verdict(bucket, members, need)
    if verdict.error == "forbidden":
        return not_checked(AREA, what, (
            f"the caller may not read bucket {bucket}'s IAM policy (it needs "
            f"storage.buckets.getIamPolicy, e.g. roles/storage.admin on the bucket)"
            f"{' nor impersonate the account' if account else ''}; make sure {who} holds "
            f"{role} on it; {DOCS}"))
    if verdict.error == "missing":
        return Check(AREA, what, False, f"Workers: bucket {bucket} ({labels}) does not exist")
    if verdict.error:
        return not_checked(AREA, what, f"bucket {bucket}'s IAM policy did not load: "
                                       f"{verdict.error}")
    if not verdict.missing:
        return Check(AREA, what, True)
    missing = ", ".join(verdict.missing)
    if verdict.undecided:
        return not_checked(AREA, what, (
            f"on bucket {bucket}, {who} lacks {missing} unless "
            f"{'; '.join(verdict.undecided)} grants it, which IAM decides at request time"))
    # Not a failure: a grant on the project, folder or organisation (common) gives the access
    # too, and only impersonation (above) can see it.
    member = shown(members[0])
    return not_checked(AREA, what, (
        f"bucket {bucket}'s IAM policy grants {member} no {missing}; unless a grant on the "
        f"project, folder or organisation gives it (preflight cannot see those without "
        f"impersonating the account), grant it {role} on the bucket: gcloud storage "
        f"buckets add-iam-policy-binding gs://{bucket} --member={member} --role={role}; "
        f"{DOCS}"))


def shown(member: str) -> str:
    """A member pattern as the user writes it: the parts preflight cannot know named."""
    return member.replace("projects/*/", "projects/PROJECT_NUMBER/").replace(
        "/*.svc.id.goog", "/PROJECT.svc.id.goog")


# --- Amazon S3 -----------------------------------------------------------------------------
def s3_checks(cfg: RunConfig, role_arn: str, who: str,
              only: tuple[str, ...] = ()) -> list[Check]:
    """IAM SimulatePrincipalPolicy of `role_arn` for the S3 actions on every bucket."""
    found = []
    buckets: dict[str, list[Place]] = {}
    for place in places(cfg, "s3", only):
        buckets.setdefault(split(place.uri)[0], []).append(place)
    for bucket, where in buckets.items():
        write = any(p.write for p in where)
        labels = ", ".join(p.label for p in where)
        what = f"{who} may {'read and write' if write else 'read'} s3://{bucket} ({labels})"
        objects = [f"arn:aws:s3:::{bucket}/{_prefix(p.uri)}*" for p in where]
        asks = [(a, r) for r in objects for a in (S3_WRITE if write else S3_READ)]
        asks.append((S3_LIST, f"arn:aws:s3:::{bucket}"))
        found.append(_simulate(cfg, role_arn, who, what, asks))
    return found


def _prefix(uri: str) -> str:
    key = split(uri)[1].split("{", 1)[0]
    return key.rstrip("/") + "/" if key else ""


def _simulate(cfg: RunConfig, role_arn: str, who: str, what: str,
              asks: list[tuple[str, str]]) -> Check:
    from botocore.exceptions import BotoCoreError, ClientError

    denied = []
    try:
        iam = _iam_client(cfg)
        for action, resource in asks:
            answer = iam.simulate_principal_policy(
                PolicySourceArn=role_arn, ActionNames=[action], ResourceArns=[resource])
            for result in answer["EvaluationResults"]:
                if result["EvalDecision"] != "allowed":
                    denied.append(f"{action} on {resource} ({result['EvalDecision']})")
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            return not_checked(AREA, what, (
                f"the caller may not simulate {role_arn}'s policies (it needs "
                f"iam:SimulatePrincipalPolicy on the role); make sure the role allows "
                f"{', '.join(sorted({a for a, _ in asks}))}; {DOCS}"))
        if code == "NoSuchEntity":
            return Check(AREA, what, False, (
                f"Workers: {who} does not exist (fix the eks.amazonaws.com/role-arn "
                f"annotation, or create the role)"))
        return not_checked(AREA, what, f"IAM did not simulate {role_arn}: {err}")
    except (BotoCoreError, StorageError) as err:
        return not_checked(AREA, what, f"no IAM client: {str(err)[:200]}")
    if denied:
        return Check(AREA, what, False, (
            f"Workers: {who} is not allowed {'; '.join(denied)} (add them to the role's "
            f"policy; {DOCS})"))
    return Check(AREA, what, True)


def _iam_client(cfg: RunConfig):
    """boto3's IAM client with the caller's AWS credentials. Its endpoint is IAM's
    (AWS_ENDPOINT_URL_IAM overrides it, as botocore reads service-specific endpoints), never
    the connection's S3 endpoint_url."""
    import boto3

    return boto3.session.Session().client("iam", region_name="us-east-1",
                                          **aws_credentials(cfg))


def aws_credentials(cfg: RunConfig) -> dict:
    """The keys of connection `aws_conn_id` (as the S3 store reads them), else nothing: the
    default chain."""
    if not cfg.aws_conn_id:
        return {}
    from tasks.io.cloud_storage import aws_connection

    found = aws_connection(cfg.aws_conn_id)
    return {k: found[k] for k in ("aws_access_key_id", "aws_secret_access_key",
                                  "aws_session_token") if k in found}
