"""What a Cloud Storage bucket's own IAM policy grants a principal: the JSON API's
`buckets.getIamPolicy` (google-cloud-storage's `Bucket.get_iam_policy`, policy version 3, so
conditional bindings come back with their condition), read with the caller's credentials
(it needs `storage.buckets.getIamPolicy`: roles/storage.admin or
roles/storage.legacyBucketOwner on the bucket). Its bindings for the principal are matched
against what each predefined role grants; a conditional binding or another role is left
for IAM to decide ("undecided")."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from tasks.errors import StorageError
from tasks.io import storage

# The permissions of the object calls the steps make (Cloud Storage, "IAM permissions for
# Cloud Storage"): reading gets and lists; writing also creates and deletes (retries
# overwrite a step's folder, release deletes temporary files).
READ = ("storage.objects.get", "storage.objects.list")
WRITE = READ + ("storage.objects.create", "storage.objects.delete")
_ALL = frozenset(WRITE)
# Those permissions in each predefined Cloud Storage role (Cloud Storage, "IAM roles for Cloud
# Storage", https://cloud.google.com/storage/docs/access-control/iam-roles; its Storage Object
# User row lists storage.objects.create, .delete, .get, .list, .restore and .update, no ACL or
# IAM policy). The Java client's StorageRoles lists the same sets for the older roles.
ROLE_PERMISSIONS = {
    "roles/storage.objectViewer": frozenset(READ),
    "roles/storage.objectCreator": frozenset({"storage.objects.create"}),
    "roles/storage.objectUser": _ALL,
    "roles/storage.objectAdmin": _ALL,
    "roles/storage.admin": _ALL,
    "roles/storage.legacyBucketReader": frozenset({"storage.objects.list"}),
    "roles/storage.legacyBucketWriter": _ALL - {"storage.objects.get"},
    "roles/storage.legacyBucketOwner": _ALL - {"storage.objects.get"},
    "roles/storage.legacyObjectReader": frozenset({"storage.objects.get"}),
    "roles/storage.legacyObjectOwner": frozenset({"storage.objects.get"}),
}
# Members that stand for everyone (IAM, "Principal identifiers").
PUBLIC = ("allUsers", "allAuthenticatedUsers")


@dataclass
class Verdict:
    missing: list[str] = field(default_factory=list)  # needed, granted by no binding
    undecided: list[str] = field(default_factory=list)  # bindings IAM decides at request
    error: str = ""  # "forbidden", "missing" (no such bucket), or why the policy did not load


def verdict(bucket: str, members: list[str], need: set[str]) -> Verdict:
    """`members`: the principal as policies name it; `*` in one matches any text."""
    from google.api_core import exceptions

    try:
        client = storage.open_storage(f"gs://{bucket}/").client
        policy = client.bucket(bucket).get_iam_policy(requested_policy_version=3)
    except (exceptions.Forbidden, exceptions.Unauthorized):
        return Verdict(error="forbidden")
    except exceptions.NotFound:
        return Verdict(error="missing")
    except (exceptions.GoogleAPICallError, StorageError) as err:
        return Verdict(error=str(err).splitlines()[0][:200])
    held: set[str] = set()
    found = Verdict()
    for binding in policy.bindings:
        bound = set(binding.get("members") or ())
        if not bound.intersection(PUBLIC) and not any(
                fnmatchcase(m, pattern) for m in bound for pattern in members):
            continue
        granted = ROLE_PERMISSIONS.get(binding["role"])
        if binding.get("condition"):
            found.undecided.append(f"{binding['role']} with the IAM condition "
                                   f"{binding['condition'].get('title') or 'untitled'}")
        elif granted is None:
            found.undecided.append(binding["role"])
        else:
            held |= granted
    found.missing = sorted(need - held)
    return found
