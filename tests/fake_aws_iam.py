"""A fake AWS IAM Query API on loopback for boto3's IAM client (point it here with
AWS_ENDPOINT_URL_IAM, botocore's service-specific endpoint variable). It serves
`SimulatePrincipalPolicy` only (IAM API Reference): for each action and resource asked,
EvalDecision `allowed` when `roles[PolicySourceArn]` maps the action to a glob the resource
matches, else `implicitDeny`; a role not in `roles` answers 404 NoSuchEntity; `deny_caller`
answers 403 AccessDenied (the caller lacks iam:SimulatePrincipalPolicy). Requests are kept in
`requests` as their form fields."""
from __future__ import annotations

from fnmatch import fnmatchcase
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

from loopback_http import LoopbackServer, QuietHandler

NS = "https://iam.amazonaws.com/doc/2010-05-08/"


def _members(form: dict, name: str) -> list[str]:
    keys = sorted((k for k in form if k.startswith(f"{name}.member.")),
                  key=lambda k: int(k.rsplit(".", 1)[1]))
    return [form[k] for k in keys]


class FakeAwsIam(LoopbackServer):
    def __init__(self):
        self.roles: dict[str, dict[str, list[str]]] = {}
        self.deny_caller = False
        self.requests: list[dict] = []
        fake = self

        class Handler(QuietHandler):
            def _reply(self, code: int, xml: str):
                self.reply(code, xml.encode(), "text/xml")

            def _error(self, code: int, kind: str, message: str):
                self._reply(code, f'<ErrorResponse xmlns="{NS}"><Error><Type>Sender</Type>'
                                  f'<Code>{kind}</Code><Message>{escape(message)}</Message>'
                                  f'</Error><RequestId>fake</RequestId></ErrorResponse>')

            def do_POST(self):  # noqa: N802
                form = {k: v[0] for k, v in parse_qs(self.body().decode()).items()}
                fake.requests.append(form)
                if form.get("Action") != "SimulatePrincipalPolicy":
                    return self._error(400, "InvalidAction", form.get("Action", ""))
                if fake.deny_caller:
                    return self._error(403, "AccessDenied", "not authorized to perform: "
                                                            "iam:SimulatePrincipalPolicy")
                role = form.get("PolicySourceArn", "")
                if role not in fake.roles:
                    return self._error(404, "NoSuchEntity", f"The role {role} cannot be found.")
                results = []
                for action in _members(form, "ActionNames"):
                    for resource in _members(form, "ResourceArns") or ["*"]:
                        ok = any(fnmatchcase(resource, g)
                                 for g in fake.roles[role].get(action, []))
                        results.append(
                            f"<member><EvalActionName>{action}</EvalActionName>"
                            f"<EvalResourceName>{escape(resource)}</EvalResourceName>"
                            f"<EvalDecision>{'allowed' if ok else 'implicitDeny'}"
                            f"</EvalDecision><MatchedStatements/><MissingContextValues/>"
                            f"</member>")
                self._reply(200, f'<SimulatePrincipalPolicyResponse xmlns="{NS}">'
                                 f"<SimulatePrincipalPolicyResult><IsTruncated>false"
                                 f"</IsTruncated><EvaluationResults>{''.join(results)}"
                                 f"</EvaluationResults></SimulatePrincipalPolicyResult>"
                                 f"<ResponseMetadata><RequestId>fake</RequestId>"
                                 f"</ResponseMetadata></SimulatePrincipalPolicyResponse>")

        super().__init__(Handler)
