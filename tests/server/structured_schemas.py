"""The ten JSON schemas the structured-output checks sample under (tests/server/test_structured_output.py
on the CPU, tools/structured_gpu_check.py through the CUDA engine)."""
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 8}},
     "required": ["ok"]},
    {"enum": ["red", "green", "blue", 7, None]},
    {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "number"}, "y": {"type": "number"}},
     "required": ["kind", "x", "y"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                "maxItems": 3}},
     "required": ["tags"]},
    {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"v": {"type": "boolean"}}, "required": ["v"]}]},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                               "flag": {"type": "boolean"}},
                                                "required": ["id", "flag"]}},
     "required": ["inner"]},
    {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{1,3}$"},
    {"$defs": {"item": {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]}},
     "type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2},
]
