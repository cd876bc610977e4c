"""jinja2 configured as transformers renders chat templates."""
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def strftime_now(format):
    return datetime.now().strftime(format)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
def r(src, **kw):
    try:
        return repr(env.from_string(src).render(**kw))
    except Exception as e:
        return "ERR %s: %s" % (type(e).__name__, e)
