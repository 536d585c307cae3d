{{/* Names: <release>-<chart> unless overridden, cut to DNS label length. */}}
{{- define "tidemq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tidemq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Broker group names, RocketMQ style: broker-a, broker-b, ... (a list, as JSON). */}}
{{- define "tidemq.brokerGroups" -}}
{{- $letters := splitList "" "abcdefghijklmnopqrstuvwxyz" -}}
{{- $groups := list -}}
{{- range $i := until (int .Values.broker.groups) -}}
{{- if lt $i 26 -}}
{{- $groups = append $groups (printf "broker-%s" (index $letters $i)) -}}
{{- end -}}
{{- end -}}
{{- toJson $groups -}}
{{- end -}}

{{/* Labels. "component" is nameserver, broker or zookeeper. */}}
{{- define "tidemq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidemq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tidemq.labels" -}}
{{ include "tidemq.selectorLabels" . }}
app.kubernetes.io/part-of: tidemq
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* metadata.annotations from commonAnnotations; nothing when there are none. */}}
{{- define "tidemq.annotations" -}}
{{- with .Values.commonAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* <registry>/<repository>:<tag or appVersion>, what `make image` builds (docker/lib.sh). */}}
{{- define "tidemq.image" -}}
{{- $image := .Values.image -}}
{{- $tag := default .Chart.AppVersion $image.tag -}}
{{- $repository := ternary (printf "%s/%s" $image.registry $image.repository) $image.repository (ne "" $image.registry) -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "tidemq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tidemq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pod spec lines every pod of the chart carries: the release's ServiceAccount, and no token
unless asked for (no pod calls the Kubernetes API). */}}
{{- define "tidemq.podServiceAccount" -}}
serviceAccountName: {{ include "tidemq.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
{{- end -}}

{{/* topologySpreadConstraints: the values' list as given, else the preset's one constraint.
Args: root, component, values (nameserver or broker), extra selector labels. */}}
{{- define "tidemq.topologySpread" -}}
{{- if .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .values.topologySpreadConstraints | nindent 2 }}
{{- else if .values.topologySpreadPreset }}
{{- $selector := merge (fromYaml (include "tidemq.selectorLabels" .)) (.extra | default dict) }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: {{ ternary "topology.kubernetes.io/zone" "kubernetes.io/hostname" (eq .values.topologySpreadPreset "zone") }}
    # Best effort: a zone or node short of capacity must not keep a broker from starting.
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- toYaml $selector | nindent 8 }}
{{- end }}
{{- end -}}

{{/* Every broker pod's name, in the order of externalAccess' per-broker lists (JSON). */}}
{{- define "tidemq.brokerPods" -}}
{{- $fullname := include "tidemq.fullname" . -}}
{{- $pods := list -}}
{{- range $group := fromJsonArray (include "tidemq.brokerGroups" .) -}}
{{- range $ordinal := until (int (add 1 $.Values.broker.slavesPerGroup)) -}}
{{- $pods = append $pods (printf "%s-%s-%d" $fullname $group $ordinal) -}}
{{- end -}}
{{- end -}}
{{- toJson $pods -}}
{{- end -}}

{{/* externalAccess: per broker pod, its Service's settings and the addresses it advertises
(JSON list of {pod, host, ip, grpc, rocketmq, grpcNodePort, rocketmqNodePort}). What a short list
lacks stays empty: the validation names it. */}}
{{- define "tidemq.externalBrokers" -}}
{{- $s := .Values.externalAccess.service -}}
{{- $nodePort := eq $s.type "NodePort" -}}
{{- $out := list -}}
{{- range $i, $pod := fromJsonArray (include "tidemq.brokerPods" .) -}}
{{- $e := dict "pod" $pod "host" "" "ip" "" "grpc" "" "rocketmq" "" "grpcNodePort" 0 "rocketmqNodePort" 0 -}}
{{- if $nodePort -}}
{{- $_ := set $e "host" (toString $s.domain) -}}
{{- if lt $i (len $s.nodePorts) -}}
{{- $_ := set $e "grpcNodePort" (int (index $s.nodePorts $i)) -}}
{{- end -}}
{{- if lt $i (len $s.rocketmqNodePorts) -}}
{{- $_ := set $e "rocketmqNodePort" (int (index $s.rocketmqNodePorts $i)) -}}
{{- end -}}
{{- if and $e.host $e.grpcNodePort -}}
{{- $_ := set $e "grpc" (printf "%s:%d" $e.host $e.grpcNodePort) -}}
{{- end -}}
{{- if and $e.host $e.rocketmqNodePort -}}
{{- $_ := set $e "rocketmq" (printf "%s:%d" $e.host $e.rocketmqNodePort) -}}
{{- end -}}
{{- else -}}
{{- if lt $i (len $s.loadBalancerIPs) -}}
{{- $_ := set $e "ip" (toString (index $s.loadBalancerIPs $i)) -}}
{{- end -}}
{{- $_ := set $e "host" $e.ip -}}
{{- if lt $i (len $s.loadBalancerNames) -}}
{{- $_ := set $e "host" (toString (index $s.loadBalancerNames $i)) -}}
{{- end -}}
{{- if $e.host -}}
{{- $_ := set $e "grpc" (printf "%s:%d" $e.host (int $s.ports.grpc)) -}}
{{- $_ := set $e "rocketmq" (printf "%s:%d" $e.host (int $s.ports.rocketmq)) -}}
{{- end -}}
{{- end -}}
{{- $out = append $out $e -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* ZooKeeper connect string: the bundled ensemble's client Service, or zookeeper.connect. */}}
{{- define "tidemq.zookeeperConnect" -}}
{{- if .Values.zookeeper.enabled -}}
{{- printf "%s-zookeeper:%d" (include "tidemq.fullname" .) (int .Values.zookeeper.containerPorts.client) -}}
{{- else -}}
{{- .Values.zookeeper.connect -}}
{{- end -}}
{{- end -}}

{{/* The group's master role: what pod 0 runs in classic mode, every pod in automatic mode. */}}
{{- define "tidemq.masterRole" -}}
{{- if eq .Values.broker.replication "SYNC" }}SYNC_MASTER{{ else }}ASYNC_MASTER{{ end -}}
{{- end -}}

{{/* Pod anti-affinity preset. Args: root, component, preset, extra selector labels. */}}
{{- define "tidemq.antiAffinity" -}}
podAntiAffinity:
  {{- $selector := merge (fromYaml (include "tidemq.selectorLabels" .)) (.extra | default dict) }}
  {{- if eq .preset "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- toYaml $selector | nindent 10 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- toYaml $selector | nindent 12 }}
  {{- end }}
{{- end -}}

{{/* Security (docs/security.md): where the TLS files and the ACL file are, and in which Secrets. */}}
{{- define "tidemq.tlsSecret" -}}
{{- default (printf "%s-tls" (include "tidemq.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "tidemq.aclSecret" -}}
{{- default (printf "%s-acl" (include "tidemq.fullname" .)) .Values.acl.existingSecret -}}
{{- end -}}

{{- define "tidemq.identitiesSecret" -}}
{{- default (printf "%s-broker-identities" (include "tidemq.fullname" .)) .Values.tls.existingIdentitiesSecret -}}
{{- end -}}

{{- define "tidemq.identityDir" -}}/etc/tidemq/identity{{- end -}}

{{/* Every name the serving certificates must cover: the Services, each group's pods through its
headless Service, and localhost (the probes dial 127.0.0.1, an IP SAN). */}}
{{- define "tidemq.tlsNames" -}}
{{- $fullname := include "tidemq.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $domain := .Values.clusterDomain -}}
{{- $names := list "localhost" -}}
{{- range $service := list (printf "%s-nameserver" $fullname) (printf "%s-broker" $fullname) -}}
{{- $names = concat $names (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.%s" $service $ns $domain)) -}}
{{- end -}}
{{- range $group := fromJsonArray (include "tidemq.brokerGroups" .) -}}
{{- $names = append $names (printf "*.%s-%s-headless.%s.svc.%s" $fullname $group $ns $domain) -}}
{{- end -}}
{{- if .Values.externalAccess.enabled -}}
{{- range $e := fromJsonArray (include "tidemq.externalBrokers" .) -}}
{{- if and $e.host (not (regexMatch "^[0-9.]+$|:" $e.host)) -}}
{{- $names = append $names $e.host -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names = concat $names .Values.tls.extraDnsNames -}}
{{- toJson (uniq $names) -}}
{{- end -}}

{{/* The IP addresses the serving certificates must cover: 127.0.0.1 (the probes), the
brokers' external IPs (and a NodePort domain given as an IP), tls.extraIpAddresses. */}}
{{- define "tidemq.tlsIps" -}}
{{- $ips := list "127.0.0.1" -}}
{{- if .Values.externalAccess.enabled -}}
{{- range $e := fromJsonArray (include "tidemq.externalBrokers" .) -}}
{{- range $address := list $e.ip $e.host -}}
{{- if regexMatch "^[0-9.]+$|:" $address -}}
{{- $ips = append $ips $address -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ips = concat $ips .Values.tls.extraIpAddresses -}}
{{- toJson (uniq $ips) -}}
{{- end -}}

{{/* [pod, certificate CN] of every broker pod: the identity it proves, broker:<group>:<id>,
with the id the pod is started with (its ordinal; ordinal+1 under automatic failover). */}}
{{- define "tidemq.brokerIdentities" -}}
{{- $fullname := include "tidemq.fullname" . -}}
{{- $first := ternary 1 0 (eq .Values.failover.mode "automatic") -}}
{{- $pods := list -}}
{{- range $group := fromJsonArray (include "tidemq.brokerGroups" .) -}}
{{- range $ordinal := until (int (add 1 $.Values.broker.slavesPerGroup)) -}}
{{- $pods = append $pods (list (printf "%s-%s-%d" $fullname $group $ordinal) (printf "broker:%s:%d" $group (add $ordinal $first))) -}}
{{- end -}}
{{- end -}}
{{- toJson $pods -}}
{{- end -}}

{{- define "tidemq.zkAuthSecret" -}}
{{- default (printf "%s-zk-auth" (include "tidemq.fullname" .)) .Values.zookeeper.auth.existingSecret -}}
{{- end -}}

{{- define "tidemq.zkAuthDir" -}}/etc/tidemq/zk-auth{{- end -}}
{{- define "tidemq.tlsDir" -}}/etc/tidemq/tls{{- end -}}
{{- define "tidemq.aclDir" -}}/etc/tidemq/acl{{- end -}}

{{/* The server flags of TLS and the ACL file (nameservers; brokers take them in broker.toml). */}}
{{- define "tidemq.securityArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-cert-file
- {{ include "tidemq.tlsDir" . }}/tls.crt
- --tls-key-file
- {{ include "tidemq.tlsDir" . }}/tls.key
- --tls-ca-file
- {{ include "tidemq.tlsDir" . }}/ca.crt
- --tls-client-auth
- {{ .Values.tls.clientAuth }}
{{- end }}
{{- if .Values.acl.enabled }}
- --acl-file
- {{ include "tidemq.aclDir" . }}/plain_acl.yml
{{- end }}
{{- end -}}

{{- define "tidemq.securityMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "tidemq.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.acl.enabled }}
- name: acl
  mountPath: {{ include "tidemq.aclDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Secret volumes: a rotated certificate or an edited ACL reaches the mounted files, which the
servers re-read; no restart. */}}
{{- define "tidemq.securityVolumes" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tidemq.tlsSecret" . }}
{{- end }}
{{- if .Values.acl.enabled }}
- name: acl
  secret:
    secretName: {{ include "tidemq.aclSecret" . }}
    items:
      - key: plain_acl.yml
        path: plain_acl.yml
{{- end }}
{{- end -}}

{{/* A health probe on a port. Args: root, probe values, port. Kubernetes' own gRPC probe cannot
speak TLS: with TLS on, the probe runs `tidemq health` in the container instead. */}}
{{- define "tidemq.probe" -}}
{{- if .root.Values.tls.enabled -}}
exec:
  command:
    - python
    - -m
    - tidemq.cli
    - health
    - "127.0.0.1:{{ .port }}"
    - --tls-ca-file
    - {{ include "tidemq.tlsDir" .root }}/ca.crt
    {{- if eq .root.Values.tls.clientAuth "require" }}
    {{- /* Mutual TLS: the probe presents the server's own certificate. */}}
    {{- $dir := ternary (include "tidemq.identityDir" .root) (include "tidemq.tlsDir" .root) (eq (toString .identity) "true") }}
    - --tls-cert-file
    - {{ $dir }}/tls.crt
    - --tls-key-file
    - {{ $dir }}/tls.key
    {{- end }}
{{- with .probe.initialDelaySeconds }}
initialDelaySeconds: {{ . }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- else -}}
{{- include "tidemq.grpcProbe" . -}}
{{- end -}}
{{- end -}}

{{/* A gRPC health probe on a port. Args: probe values, port. */}}
{{- define "tidemq.grpcProbe" -}}
grpc:
  port: {{ .port }}
{{- with .probe.initialDelaySeconds }}
initialDelaySeconds: {{ . }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{- define "tidemq.podSecurityContext" -}}
{{- if .Values.podSecurityContext.enabled }}
securityContext:
  runAsNonRoot: true
  {{- toYaml (omit .Values.podSecurityContext "enabled") | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tidemq.containerSecurityContext" -}}
{{- if .Values.containerSecurityContext.enabled }}
securityContext:
  runAsNonRoot: true
  capabilities:
    drop: [ALL]
  {{- toYaml (omit .Values.containerSecurityContext "enabled") | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tidemq.storageClass" -}}
{{- if .storageClass }}
{{- if eq "-" .storageClass }}
storageClassName: ""
{{- else }}
storageClassName: {{ .storageClass | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The archive (docs/archive.md). Every broker group has its own, `<archive>/<group>`: its master
writes it and its slaves read its manifest. The base is archive.uri, or the mounted volume. */}}
{{- define "tidemq.archiveBase" -}}
{{- $a := .Values.archive -}}
{{- trimSuffix "/" (default $a.volume.mountPath $a.uri) -}}
{{- end -}}

{{- define "tidemq.archiveIsS3" -}}
{{- if hasPrefix "s3://" (include "tidemq.archiveBase" .) }}true{{ end -}}
{{- end -}}

{{/* A group's archive URI (--archive-uri). Args: root, group. */}}
{{- define "tidemq.archiveUri" -}}
{{- printf "%s/%s" (include "tidemq.archiveBase" .root) .group -}}
{{- end -}}

{{/* A group's archive directory, for a directory archive (empty for S3). Args: root, group. */}}
{{- define "tidemq.archiveDir" -}}
{{- if not (include "tidemq.archiveIsS3" .root) -}}
{{- trimPrefix "file://" (include "tidemq.archiveUri" .) -}}
{{- end -}}
{{- end -}}

{{/*
Validation: every rule adds its message; the render fails once with all of them.
*/}}
{{- define "tidemq.validateValues" -}}
{{- $v := .Values -}}
{{- $m := list -}}
{{- if lt (int $v.nameserver.replicaCount) 1 -}}
{{- $m = append $m "nameserver.replicaCount: at least 1 nameserver is needed (2 or more to survive losing one)" -}}
{{- end -}}
{{- if or (lt (int $v.broker.groups) 1) (gt (int $v.broker.groups) 26) -}}
{{- $m = append $m (printf "broker.groups: must be 1 to 26 (broker-a to broker-z), got %v" $v.broker.groups) -}}
{{- end -}}
{{- if lt (int $v.broker.slavesPerGroup) 0 -}}
{{- $m = append $m "broker.slavesPerGroup: must be 0 or more" -}}
{{- end -}}
{{- if not (has $v.broker.replication (list "ASYNC" "SYNC")) -}}
{{- $m = append $m (printf "broker.replication: must be ASYNC or SYNC, got %v" $v.broker.replication) -}}
{{- end -}}
{{- if not (has $v.broker.flush (list "ASYNC" "SYNC")) -}}
{{- $m = append $m (printf "broker.flush: must be ASYNC or SYNC, got %v" $v.broker.flush) -}}
{{- end -}}
{{- if eq $v.broker.replication "SYNC" -}}
{{- if lt (int $v.broker.slavesPerGroup) 1 -}}
{{- $m = append $m "broker.replication=SYNC needs slaves: set broker.slavesPerGroup to 1 or more" -}}
{{- else if or (lt (int $v.broker.minInsyncReplicas) 1) (gt (int $v.broker.minInsyncReplicas) (int $v.broker.slavesPerGroup)) -}}
{{- $m = append $m (printf "broker.minInsyncReplicas: must be 1 to broker.slavesPerGroup (%v), got %v" $v.broker.slavesPerGroup $v.broker.minInsyncReplicas) -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.failover.mode (list "classic" "automatic")) -}}
{{- $m = append $m (printf "failover.mode: must be classic or automatic, got %v" $v.failover.mode) -}}
{{- end -}}
{{- if eq $v.failover.mode "automatic" -}}
{{- if lt (int $v.broker.slavesPerGroup) 1 -}}
{{- $m = append $m "failover.mode=automatic needs slaves to elect: set broker.slavesPerGroup to 1 or more" -}}
{{- end -}}
{{- if and (not $v.zookeeper.enabled) (not $v.zookeeper.connect) -}}
{{- $m = append $m "failover.mode=automatic elects masters in ZooKeeper: set zookeeper.enabled=true or zookeeper.connect" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $v.failover.mode "automatic") (toString $v.failover.electionPriority) -}}
{{- $m = append $m "failover.electionPriority: only applies with failover.mode=automatic" -}}
{{- end -}}
{{- if not (has $v.tls.clientAuth (list "none" "require")) -}}
{{- $m = append $m (printf "tls.clientAuth: must be none or require, got %v" $v.tls.clientAuth) -}}
{{- else if and (eq $v.tls.clientAuth "require") (not $v.tls.enabled) -}}
{{- $m = append $m "tls.clientAuth=require is mutual TLS: it needs tls.enabled=true" -}}
{{- else if and (eq $v.tls.clientAuth "require") $v.tls.existingSecret (not $v.tls.existingIdentitiesSecret) -}}
{{- $m = append $m "tls.clientAuth=require with tls.existingSecret: give the brokers' certificates in tls.existingIdentitiesSecret (<pod>.crt and <pod>.key, CN broker:<group>:<id>), issued by your CA" -}}
{{- end -}}
{{- if and $v.zookeeper.enabled $v.zookeeper.connect -}}
{{- $m = append $m "zookeeper.connect: set for an external ensemble, which needs zookeeper.enabled=false (the bundled one is enabled)" -}}
{{- else if and (not $v.zookeeper.enabled) (not $v.zookeeper.connect) (ne $v.failover.mode "automatic") -}}
{{- $m = append $m "zookeeper: the registry needs ZooKeeper: set zookeeper.enabled=true, or zookeeper.connect to an external ensemble" -}}
{{- end -}}
{{- if and $v.zookeeper.enabled (or (lt (int $v.zookeeper.replicaCount) 1) (eq (mod (int $v.zookeeper.replicaCount) 2) 0)) -}}
{{- $m = append $m (printf "zookeeper.replicaCount: must be odd (1, 3, 5) for a quorum, got %v" $v.zookeeper.replicaCount) -}}
{{- end -}}
{{- if not (regexMatch "^/[^/]" (toString $v.zookeeper.root)) -}}
{{- $m = append $m (printf "zookeeper.root: must be an absolute znode path such as /tidemq, got %v" $v.zookeeper.root) -}}
{{- end -}}
{{- if $v.zookeeper.enabled -}}
{{- $min := mul 2 (int $v.zookeeper.tickTime) -}}
{{- $max := mul 20 (int $v.zookeeper.tickTime) -}}
{{- range $what, $ms := dict "broker.zkSessionTimeoutMs" $v.broker.zkSessionTimeoutMs "nameserver.zkSessionTimeoutMs" $v.nameserver.zkSessionTimeoutMs -}}
{{- if or (lt (int $ms) $min) (gt (int $ms) $max) -}}
{{- $m = append $m (printf "%s: ZooKeeper grants session timeouts of 2 to 20 ticks (%d to %d ms with tickTime %v), got %v" $what $min $max $v.zookeeper.tickTime $ms) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.broker.persistence.enabled (not $v.broker.persistence.size) -}}
{{- $m = append $m "broker.persistence.size: required when broker.persistence.enabled" -}}
{{- end -}}
{{- range $what, $preset := dict "nameserver" $v.nameserver.podAntiAffinityPreset "broker" $v.broker.podAntiAffinityPreset "zookeeper" $v.zookeeper.podAntiAffinityPreset -}}
{{- if not (has $preset (list "soft" "hard")) -}}
{{- $m = append $m (printf "%s.podAntiAffinityPreset: must be soft or hard, got %v" $what $preset) -}}
{{- end -}}
{{- end -}}
{{- /* The ports in use: a disabled listener's port does not matter. */ -}}
{{- $used := dict "broker.containerPorts.grpc" $v.broker.containerPorts.grpc "nameserver.containerPorts.grpc" $v.nameserver.containerPorts.grpc "nameserver.service.ports.grpc" $v.nameserver.service.ports.grpc -}}
{{- if $v.metrics.enabled -}}
{{- $_ := set $used "broker.containerPorts.metrics" $v.broker.containerPorts.metrics -}}
{{- end -}}
{{- if $v.broker.rocketmq.enabled -}}
{{- $_ := set $used "broker.containerPorts.rocketmq" $v.broker.containerPorts.rocketmq -}}
{{- $_ := set $used "broker.service.ports.rocketmq" $v.broker.service.ports.rocketmq -}}
{{- end -}}
{{- range $what, $port := $used -}}
{{- if not (regexMatch "^[0-9]+$" (toString $port)) -}}
{{- $m = append $m (printf "%s: must be a port number (1 to 65535), got %v" $what $port) -}}
{{- else if or (lt (int $port) 1) (gt (int $port) 65535) -}}
{{- $m = append $m (printf "%s: must be a port number (1 to 65535), got %v" $what $port) -}}
{{- end -}}
{{- end -}}
{{- $ports := list (int $v.broker.containerPorts.grpc) -}}
{{- if $v.metrics.enabled -}}
{{- $ports = append $ports (int $v.broker.containerPorts.metrics) -}}
{{- end -}}
{{- if $v.broker.rocketmq.enabled -}}
{{- $ports = append $ports (int $v.broker.containerPorts.rocketmq) -}}
{{- end -}}
{{- if ne (len $ports) (len (uniq $ports)) -}}
{{- $m = append $m "broker.containerPorts: grpc, metrics (with metrics.enabled) and rocketmq (with broker.rocketmq.enabled) must be different ports" -}}
{{- end -}}
{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.enabled) -}}
{{- $m = append $m "metrics.serviceMonitor.enabled needs metrics.enabled=true (nothing to scrape otherwise)" -}}
{{- end -}}
{{- if and $v.monitoring.prometheusRule.enabled (not $v.metrics.enabled) -}}
{{- $m = append $m "monitoring.prometheusRule.enabled needs metrics.enabled=true (the alerts read the servers' metrics)" -}}
{{- end -}}
{{- if and $v.monitoring.dashboard.enabled (not $v.monitoring.dashboard.label) -}}
{{- $m = append $m "monitoring.dashboard.label: the label Grafana's sidecar selects dashboards by, e.g. grafana_dashboard" -}}
{{- end -}}
{{- if $v.console.enabled -}}
{{- if and $v.tls.enabled (eq $v.tls.clientAuth "require") -}}
{{- $m = append $m "console.enabled: the console has no client certificate, so it cannot join a cluster with tls.clientAuth=require" -}}
{{- end -}}
{{- if not (has $v.console.logFormat (list "text" "json")) -}}
{{- $m = append $m (printf "console.logFormat: must be text or json, got %v" $v.console.logFormat) -}}
{{- end -}}
{{- range $what, $port := dict "console.containerPorts.http" $v.console.containerPorts.http "console.service.ports.http" $v.console.service.ports.http -}}
{{- if or (not (regexMatch "^[0-9]+$" (toString $port))) (lt (int $port) 1) (gt (int $port) 65535) -}}
{{- $m = append $m (printf "%s: must be a port number (1 to 65535), got %v" $what $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.metrics.enabled (eq (int $v.nameserver.containerPorts.metrics) (int $v.nameserver.containerPorts.grpc)) -}}
{{- $m = append $m "nameserver.containerPorts: grpc and metrics (with metrics.enabled) must be different ports" -}}
{{- end -}}
{{- range $what, $preset := dict "nameserver" $v.nameserver.topologySpreadPreset "broker" $v.broker.topologySpreadPreset -}}
{{- if not (has $preset (list "" "zone" "hostname")) -}}
{{- $m = append $m (printf "%s.topologySpreadPreset: must be empty, zone or hostname, got %v" $what $preset) -}}
{{- end -}}
{{- end -}}
{{- if $v.externalAccess.enabled -}}
{{- $s := $v.externalAccess.service -}}
{{- $pods := fromJsonArray (include "tidemq.brokerPods" .) -}}
{{- $count := len $pods -}}
{{- $order := printf "%d broker pods, in this order: %s" $count (join ", " $pods) -}}
{{- if $v.externalAccess.autoDiscovery.enabled -}}
{{- $m = append $m "externalAccess.autoDiscovery.enabled: not supported; give each broker's address in externalAccess.service (loadBalancerIPs, loadBalancerNames, or domain and nodePorts)" -}}
{{- end -}}
{{- if eq $s.type "NodePort" -}}
{{- if not $s.domain -}}
{{- $m = append $m "externalAccess.service.domain: required with type NodePort: the host name or IP clients reach the nodes at" -}}
{{- end -}}
{{- $range := regexFindAll "[0-9]+" (toString $s.nodePortRange) -1 -}}
{{- if or (ne (len $range) 2) (not (regexMatch "^[0-9]+-[0-9]+$" (toString $s.nodePortRange))) -}}
{{- $m = append $m (printf "externalAccess.service.nodePortRange: must be FIRST-LAST (the cluster's --service-node-port-range), got %v" $s.nodePortRange) -}}
{{- else -}}
{{- $lists := dict "nodePorts" $s.nodePorts -}}
{{- if $v.broker.rocketmq.enabled -}}
{{- $_ := set $lists "rocketmqNodePorts" $s.rocketmqNodePorts -}}
{{- end -}}
{{- $all := list -}}
{{- range $name, $ports := $lists -}}
{{- if lt (len $ports) $count -}}
{{- $m = append $m (printf "externalAccess.service.%s: one node port per broker pod: %s; got %d" $name $order (len $ports)) -}}
{{- end -}}
{{- range $port := $ports -}}
{{- if or (lt (int $port) (int (index $range 0))) (gt (int $port) (int (index $range 1))) -}}
{{- $m = append $m (printf "externalAccess.service.%s: %v is outside the node port range %v" $name $port $s.nodePortRange) -}}
{{- end -}}
{{- $all = append $all (int $port) -}}
{{- end -}}
{{- end -}}
{{- if ne (len $all) (len (uniq $all)) -}}
{{- $m = append $m "externalAccess.service.nodePorts and rocketmqNodePorts: every node port must be different" -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if and (not $s.loadBalancerIPs) (not $s.loadBalancerNames) -}}
{{- $m = append $m (printf "externalAccess.service: type LoadBalancer needs the address each broker advertises: loadBalancerIPs or loadBalancerNames, %s" $order) -}}
{{- end -}}
{{- range $name := list "loadBalancerIPs" "loadBalancerNames" -}}
{{- $list := index $s $name -}}
{{- if and $list (lt (len $list) $count) -}}
{{- $m = append $m (printf "externalAccess.service.%s: one per broker pod: %s; got %d" $name $order (len $list)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $advertised := list -}}
{{- range $e := fromJsonArray (include "tidemq.externalBrokers" .) -}}
{{- if $e.grpc -}}
{{- $advertised = append $advertised $e.grpc -}}
{{- end -}}
{{- end -}}
{{- if ne (len $advertised) (len (uniq $advertised)) -}}
{{- $m = append $m (printf "externalAccess.service: two brokers would advertise the same address: %s" (join ", " $advertised)) -}}
{{- end -}}
{{- range $what, $port := dict "externalAccess.service.ports.grpc" $s.ports.grpc "externalAccess.service.ports.rocketmq" $s.ports.rocketmq -}}
{{- if or (not (regexMatch "^[0-9]+$" (toString $port))) (lt (int $port) 1) (gt (int $port) 65535) -}}
{{- $m = append $m (printf "%s: must be a port number (1 to 65535), got %v" $what $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.archive.enabled -}}
{{- $a := $v.archive -}}
{{- $claim := $a.volume.existingClaim -}}
{{- $mount := trimSuffix "/" (toString $a.volume.mountPath) -}}
{{- $uri := toString $a.uri -}}
{{- if and $uri (not (regexMatch "^(s3://|file:///|/)" $uri)) -}}
{{- $m = append $m (printf "archive.uri: must be s3://BUCKET/PREFIX, file:///PATH or an absolute path, got %s" $uri) -}}
{{- else if and (not $uri) (not $claim) -}}
{{- $m = append $m "archive.enabled: say where the archive is: archive.uri (s3://BUCKET/PREFIX) or archive.volume.existingClaim (a ReadWriteMany PersistentVolumeClaim every broker pod mounts at archive.volume.mountPath)" -}}
{{- else if hasPrefix "s3://" $uri -}}
{{- if not (regexMatch "^s3://[^/]+" $uri) -}}
{{- $m = append $m (printf "archive.uri: %s names no bucket (s3://BUCKET/PREFIX)" $uri) -}}
{{- end -}}
{{- if and (not $a.s3.existingSecret) (not $a.s3.useInstanceRole) -}}
{{- $m = append $m "archive.uri is an S3 bucket: give its credentials in archive.s3.existingSecret (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or set archive.s3.useInstanceRole=true for the pods' own identity (an IAM role for the ServiceAccount, an instance profile)" -}}
{{- end -}}
{{- if $claim -}}
{{- $m = append $m "archive.volume.existingClaim: the archive is an S3 bucket (archive.uri); the volume would be unused: leave one of them empty" -}}
{{- end -}}
{{- else if not $claim -}}
{{- $m = append $m (printf "archive.uri %s is a directory: mount one with archive.volume.existingClaim (a ReadWriteMany PersistentVolumeClaim every broker pod mounts at archive.volume.mountPath); the container's own file system is read-only" $uri) -}}
{{- else -}}
{{- $dir := trimPrefix "file://" $uri -}}
{{- if and $dir (ne $dir $mount) (not (hasPrefix (printf "%s/" $mount) $dir)) -}}
{{- $m = append $m (printf "archive.uri: the directory %s is not on the archive volume (archive.volume.mountPath %s)" $dir $mount) -}}
{{- end -}}
{{- end -}}
{{- if $claim -}}
{{- range $taken := list "/var/lib/tidemq/store" "/etc/tidemq" "/tmp" -}}
{{- if or (eq $mount $taken) (hasPrefix (printf "%s/" $taken) $mount) (hasPrefix (printf "%s/" $mount) $taken) -}}
{{- $m = append $m (printf "archive.volume.mountPath: %s overlaps %s, where the broker mounts another volume" $mount $taken) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $m -}}
{{- printf "\nVALUES VALIDATION:\n- %s" (join "\n- " $m) | fail -}}
{{- end -}}
{{- end -}}
