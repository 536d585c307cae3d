"""Who may call what (docs/security.md): accounts and permissions from an ACL file in RocketMQ's
``plain_acl.yml`` format (``acl``), the permission each RPC needs (``rules``), the decision for
one call (``guard``), and its place on the wire (``on_the_wire``)."""
