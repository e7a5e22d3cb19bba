{{/* The chart's name, or nameOverride. */}}
{{- define "highwater.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: <release>-<chart> unless the release name holds the chart's. */}}
{{- define "highwater.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "highwater.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The standard labels; pass (dict "root" $ "component" "broker"). */}}
{{- define "highwater.labels" -}}
helm.sh/chart: {{ include "highwater.chart" .root }}
{{ include "highwater.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: highwater
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "highwater.selectorLabels" -}}
app.kubernetes.io/name: {{ include "highwater.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "highwater.annotations" -}}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The image: global.imageRegistry, else image.registry, then the repository and the
digest or tag. */}}
{{- define "highwater.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- $registry := default .Values.image.registry (.Values.global).imageRegistry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ printf "%s@%s" $repository .Values.image.digest }}
{{- else -}}
{{ printf "%s:%s" $repository $tag }}
{{- end -}}
{{- end -}}

{{- define "highwater.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "highwater.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component> and its headless Service <fullname>-<component>-headless. */}}
{{- define "highwater.component" -}}
{{- printf "%s-%s" (include "highwater.fullname" .root) .component -}}
{{- end -}}

{{- define "highwater.headless" -}}
{{- printf "%s-%s-headless" (include "highwater.fullname" .root) .component -}}
{{- end -}}

{{/* Replicas of __consumer_offsets: the value, else min(3, brokers). */}}
{{- define "highwater.offsetsTopicReplicationFactor" -}}
{{- if .Values.controller.offsetsTopicReplicationFactor -}}
{{- .Values.controller.offsetsTopicReplicationFactor -}}
{{- else -}}
{{- min 3 .Values.broker.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Checks that span keys, which values.schema.json cannot express. */}}
{{- define "highwater.validate" -}}
{{- if and (eq .Values.metadata.mode "etcd") (not .Values.metadata.etcd.endpoints) -}}
{{- fail "metadata.etcd.endpoints: metadata.mode etcd needs the etcd members' host:port" -}}
{{- end -}}
{{- $etcdTls := .Values.metadata.etcd.tls -}}
{{- if and $etcdTls.enabled (not $etcdTls.secret) -}}
{{- fail "metadata.etcd.tls.secret: TLS to etcd needs the Secret holding its CA (and a client certificate)" -}}
{{- end -}}
{{- if ne (empty $etcdTls.certKey) (empty $etcdTls.keyKey) -}}
{{- fail "metadata.etcd.tls.certKey, metadata.etcd.tls.keyKey: a client certificate needs its key, and a key its certificate" -}}
{{- end -}}
{{- $c := .Values.controller -}}
{{- $b := .Values.broker -}}
{{- $g := .Values.coordinator -}}
{{- $ranges := list (list "controller" (int $c.nodeIdOffset) (int $c.replicaCount)) (list "broker" (int $b.nodeIdOffset) (int $b.replicaCount)) (list "coordinator" (int $g.nodeIdOffset) (int $g.replicaCount)) -}}
{{- range $i, $x := $ranges -}}
{{- range $j, $y := $ranges -}}
{{- if and (lt $i $j) (lt (index $x 1) (add (index $y 1) (index $y 2))) (lt (index $y 1) (add (index $x 1) (index $x 2))) -}}
{{- fail (printf "%s.nodeIdOffset and %s.nodeIdOffset: the node ids %s %d-%d and %s %d-%d overlap; node ids are unique across the cluster" (index $x 0) (index $y 0) (index $x 0) (index $x 1) (sub (add (index $x 1) (index $x 2)) 1) (index $y 0) (index $y 1) (sub (add (index $y 1) (index $y 2)) 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $c.offsetsTopicReplicationFactor (gt (int $c.offsetsTopicReplicationFactor) (int $b.replicaCount)) -}}
{{- fail (printf "controller.offsetsTopicReplicationFactor: %d is more than broker.replicaCount (%d)" (int $c.offsetsTopicReplicationFactor) (int $b.replicaCount)) -}}
{{- end -}}
{{- if lt (int $b.terminationGracePeriodSeconds) (add (int $b.rollingRestart.preStopTimeoutSeconds) 30) -}}
{{- fail (printf "broker.terminationGracePeriodSeconds: %d leaves no time for the controlled shutdown after broker.rollingRestart.preStopTimeoutSeconds (%d); give at least %d" (int $b.terminationGracePeriodSeconds) (int $b.rollingRestart.preStopTimeoutSeconds) (add (int $b.rollingRestart.preStopTimeoutSeconds) 30)) -}}
{{- end -}}
{{- end -}}

{{/* Pod anti-affinity (preset soft|hard|none) unless affinity is given; topology spread. */}}
{{- define "highwater.scheduling" -}}
{{- $values := index .root.Values .component -}}
{{- $selector := include "highwater.selectorLabels" . -}}
{{- if $values.affinity }}
affinity:
  {{- toYaml $values.affinity | nindent 2 }}
{{- else if eq $values.podAntiAffinityPreset "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- $selector | nindent 12 }}
{{- else if eq $values.podAntiAffinityPreset "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- $selector | nindent 14 }}
{{- end }}
{{- if $values.topologySpread.enabled }}
topologySpreadConstraints:
  - maxSkew: {{ $values.topologySpread.maxSkew }}
    topologyKey: {{ $values.topologySpread.topologyKey }}
    whenUnsatisfiable: {{ $values.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- $selector | nindent 8 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Probes on grpc.health.v1 at the component's port; pass (dict "probe" ... "port" ...
"tls" ...). The kubelet's gRPC probe speaks no TLS: with "tls", an exec probe asks the
same over TLS with the pod's certificate (files/health_check.py). */}}
{{- define "highwater.grpcProbe" -}}
{{- if .tls }}
exec:
  command: [python3, /opt/highwater/scripts/health_check.py, {{ .port | quote }}{{ with .service }}, {{ . | quote }}{{ end }}]
{{- else }}
grpc:
  port: {{ .port }}
  {{- with .service }}
  service: {{ . }}
  {{- end }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{/* The environment every Highwater container starts from. */}}
{{- define "highwater.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}

{{- define "highwater.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* prometheus.io annotations of a pod, when metrics are on and annotations asked for. */}}
{{- define "highwater.scrapeAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/* The server config keys of a role's properties file, as YAML: the chart's defaults
(safe for three brokers, following broker.replicaCount below it), the role's own settings
from their values, then config, then the role's config. Pass (dict "root" $ "component" c). */}}
{{- define "highwater.serverConfig" -}}
{{- $root := .root -}}
{{- $values := index $root.Values .component -}}
{{- $rf := min 3 (int $root.Values.broker.replicaCount) -}}
{{- $chart := dict "default.replication.factor" $rf "min.insync.replicas" (ternary 2 1 (ge (int $rf) 3)) "offsets.topic.replication.factor" (int (include "highwater.offsetsTopicReplicationFactor" $root)) -}}
{{- if eq .component "controller" -}}
{{- $_ := set $chart "metadata.log.max.record.bytes.between.snapshots" (int64 $values.metadataLogMaxRecordBytesBetweenSnapshots) -}}
{{- else if eq .component "broker" -}}
{{- $_ := set $chart "replica.lag.time.max.ms" (int64 $values.replicaLagTimeMaxMs) -}}
{{- else if eq .component "coordinator" -}}
{{- $_ := set $chart "group.initial.rebalance.delay.ms" (int64 $values.groupInitialRebalanceDelayMs) -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $chart (deepCopy ($root.Values.config | default dict)) (deepCopy ($values.config | default dict))) -}}
{{- end -}}

{{/* One value in Java-properties form: whole numbers without an exponent, lists joined
with commas, backslashes escaped. */}}
{{- define "highwater.propertyValue" -}}
{{- if kindIs "slice" . -}}
{{- join "," . | replace "\\" "\\\\" -}}
{{- else if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . | replace "\\" "\\\\" -}}
{{- end -}}
{{- end -}}

{{/* A role's properties file (`highwater <role> --config`); pass (dict "root" $ "component" c). */}}
{{- define "highwater.properties" -}}
{{- $values := index .root.Values .component -}}
# The {{ .component }}s' server configuration (Kafka's key names), rendered by the chart.
{{- range $key, $value := include "highwater.serverConfig" . | fromYaml }}
{{ $key }}={{ include "highwater.propertyValue" $value }}
{{- end }}
{{- with $values.extraConfig }}
{{ trim . }}
{{- end }}
{{- end -}}

{{/* Checks of the server configuration the controllers start with: replication that the
brokers can give, and a min.insync.replicas that the replication factor can meet. */}}
{{- define "highwater.validateServerConfig" -}}
{{- $config := include "highwater.serverConfig" (dict "root" . "component" "controller") | fromYaml -}}
{{- $brokers := int .Values.broker.replicaCount -}}
{{- $rf := int (index $config "default.replication.factor") -}}
{{- $isr := int (index $config "min.insync.replicas") -}}
{{- if gt $rf $brokers -}}
{{- fail (printf "config default.replication.factor: %d is more than broker.replicaCount (%d)" $rf $brokers) -}}
{{- end -}}
{{- if gt $isr $rf -}}
{{- fail (printf "config min.insync.replicas: %d is above default.replication.factor (%d), so no acks=all produce could succeed" $isr $rf) -}}
{{- end -}}
{{- $offsets := int (index $config "offsets.topic.replication.factor") -}}
{{- if gt $offsets $brokers -}}
{{- fail (printf "config offsets.topic.replication.factor: %d is more than broker.replicaCount (%d)" $offsets $brokers) -}}
{{- end -}}
{{- range $component := list "controller" "broker" -}}
{{- $values := index $.Values $component -}}
{{- if and $values.persistence.existingClaim (gt (int $values.replicaCount) 1) -}}
{{- fail (printf "%s.persistence.existingClaim: one claim cannot serve %d replicas; each pod needs a volume of its own (leave it empty, or set %s.replicaCount to 1)" $component (int $values.replicaCount) $component) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The main container's extra environment sources, volume mounts and the pod's extra
volumes, sidecars and init containers of a role; pass (dict "root" $ "component" c). */}}
{{- define "highwater.extraEnvFrom" -}}
{{- $values := index .root.Values .component -}}
{{- with $values.extraEnvVarsCM }}
- configMapRef:
    name: {{ . }}
{{- end }}
{{- with $values.extraEnvVarsSecret }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{/* The properties-file volume of a role's pod. */}}
{{- define "highwater.configVolume" -}}
- name: server-config
  configMap:
    name: {{ include "highwater.fullname" .root }}-server-config
    items:
      {{- if .component }}
      - key: {{ .component }}.properties
        path: {{ .component }}.properties
      {{- end }}
      {{- if .root.Values.tls.enabled }}
      - key: client.properties
        path: client.properties
      {{- end }}
{{- end -}}

{{/* externalAccess.service of a role (broker: externalAccess.service, coordinator:
externalAccess.coordinator.service); pass (dict "root" $ "component" c). */}}
{{- define "highwater.externalService" -}}
{{- if eq .component "broker" -}}
{{- toYaml .root.Values.externalAccess.service -}}
{{- else -}}
{{- toYaml .root.Values.externalAccess.coordinator.service -}}
{{- end -}}
{{- end -}}

{{/* "true" when a role's pods discover their external address from their Service: a
NodePort or a load-balancer address that the values do not give for every pod. */}}
{{- define "highwater.externalDiscovery" -}}
{{- $values := index .root.Values .component -}}
{{- $service := include "highwater.externalService" . | fromYaml -}}
{{- if .root.Values.externalAccess.enabled -}}
{{- if and (eq $service.type "NodePort") (lt (len ($service.nodePorts | default list)) (int $values.replicaCount)) -}}
true
{{- else if and (eq $service.type "LoadBalancer") (lt (len ($service.loadBalancerIPs | default list)) (int $values.replicaCount)) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of the external Service of pod $ordinal of a role: <fullname>-<role>-<n>-external. */}}
{{- define "highwater.externalServiceName" -}}
{{- printf "%s-%s-%d-external" (include "highwater.fullname" .root) .component (int .ordinal) -}}
{{- end -}}

{{/* The environment of a role's external listener (files/common.sh external_address). */}}
{{- define "highwater.externalEnv" -}}
{{- if .root.Values.externalAccess.enabled -}}
{{- $service := include "highwater.externalService" . | fromYaml -}}
- name: EXTERNAL_PORT
  value: {{ $service.port | quote }}
- name: EXTERNAL_SERVICE_TYPE
  value: {{ $service.type | quote }}
- name: EXTERNAL_DOMAIN
  value: {{ $service.domain | default "" | quote }}
- name: EXTERNAL_NODE_PORTS
  value: {{ join " " ($service.nodePorts | default list) | quote }}
- name: EXTERNAL_LOAD_BALANCER_IPS
  value: {{ join " " ($service.loadBalancerIPs | default list) | quote }}
- name: HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
{{- end -}}
{{- end -}}

{{/* The init container that discovers a pod's external address from its Service. */}}
{{- define "highwater.externalDiscoveryContainer" -}}
- name: external-address
  image: {{ include "highwater.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: [python3, /opt/highwater/scripts/external_address.py, /var/run/highwater-external/address]
  env:
    {{- include "highwater.env" .root | nindent 4 }}
    {{- include "highwater.externalEnv" . | nindent 4 }}
    - name: EXTERNAL_SERVICE_PREFIX
      value: {{ printf "%s-%s" (include "highwater.fullname" .root) .component | quote }}
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {cpu: 200m, memory: 128Mi}
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: external-address
      mountPath: /var/run/highwater-external
    - name: scripts
      mountPath: /opt/highwater/scripts
      readOnly: true
    # A token for this container alone: the server itself gets none.
    - name: service-reader-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}

{{/* The volumes of external-address discovery. */}}
{{- define "highwater.externalDiscoveryVolumes" -}}
- name: external-address
  emptyDir:
    sizeLimit: 1Mi
- name: service-reader-token
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 600
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
{{- end -}}

{{/* Checks of externalAccess that the schema cannot express. */}}
{{- define "highwater.validateExternalAccess" -}}
{{- if .Values.externalAccess.enabled -}}
{{- range $component := list "broker" "coordinator" -}}
{{- $service := include "highwater.externalService" (dict "root" $ "component" $component) | fromYaml -}}
{{- $key := ternary "externalAccess.service" "externalAccess.coordinator.service" (eq $component "broker") -}}
{{- if and (eq $service.type "ClusterIP") (not $service.domain) -}}
{{- fail (printf "%s.domain: a ClusterIP external access needs the host clients reach the forwarded ports on (e.g. localhost)" $key) -}}
{{- end -}}
{{- $ports := list (int (index $.Values $component).port) (int $.Values.metrics.port) -}}
{{- if has (int $service.port) $ports -}}
{{- fail (printf "%s.port: %d is already a port of the %s pods" $key (int $service.port) $component) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret of the pods' certificate: tls.existingSecret, else cert-manager's. */}}
{{- define "highwater.tlsSecret" -}}
{{- default (printf "%s-tls" (include "highwater.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{/* The super users (super.users): auth.superUsers and, with the chart's certificate,
the pods' own principal. */}}
{{- define "highwater.superUsers" -}}
{{- $users := .Values.auth.superUsers | default list -}}
{{- if not .Values.tls.existingSecret -}}
{{- $users = prepend $users (printf "User:%s" (include "highwater.fullname" .)) -}}
{{- end -}}
{{- join ";" (uniq $users) -}}
{{- end -}}

{{/* The security settings of the <release>-config ConfigMap: the --tls-* files and the
auth flags the start scripts pass (files/*.sh), and the tools' client config. */}}
{{- define "highwater.securityConfig" -}}
{{- if .Values.tls.enabled }}
TLS_CERT_FILE: /etc/highwater-tls/tls.crt
TLS_KEY_FILE: /etc/highwater-tls/tls.key
TLS_CA_FILE: /etc/highwater-tls/ca.crt
TLS_CLIENT_AUTH: {{ .Values.tls.clientAuth | quote }}
CLIENT_CONFIG: /etc/highwater/client.properties
{{- end }}
{{- if .Values.auth.enabled }}
AUTHORIZER: acl
SUPER_USERS: {{ include "highwater.superUsers" . | quote }}
ALLOW_EVERYONE_IF_NO_ACL_FOUND: {{ ternary "true" "" .Values.auth.allowEveryoneIfNoAclFound | quote }}
SASL_ENABLED_MECHANISMS: {{ join "," .Values.auth.saslMechanisms | quote }}
{{- if .Values.auth.oauthbearer.jwksConfigMap }}
OAUTHBEARER_JWKS_FILE: {{ printf "/etc/highwater-jwks/%s" .Values.auth.oauthbearer.jwksKey | quote }}
{{- end }}
OAUTHBEARER_ISSUER: {{ .Values.auth.oauthbearer.issuer | quote }}
OAUTHBEARER_AUDIENCE: {{ .Values.auth.oauthbearer.audience | quote }}
{{- end }}
{{- if include "highwater.etcdTls" . }}
{{- $etcdTls := .Values.metadata.etcd.tls }}
ETCD_CA_FILE: {{ printf "/etc/highwater-etcd-tls/%s" $etcdTls.caKey | quote }}
{{- if $etcdTls.certKey }}
ETCD_CERT_FILE: {{ printf "/etc/highwater-etcd-tls/%s" $etcdTls.certKey | quote }}
ETCD_KEY_FILE: {{ printf "/etc/highwater-etcd-tls/%s" $etcdTls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* "true" when the brokers and coordinators reach etcd over TLS (etcd mode with
metadata.etcd.tls.enabled), else empty. */}}
{{- define "highwater.etcdTls" -}}
{{- if and (eq .Values.metadata.mode "etcd") .Values.metadata.etcd.tls.enabled -}}
true
{{- end -}}
{{- end -}}

{{/* The client config of the tools in the pods (probes, gates, hooks, helm test): the
pods' own certificate, whose principal is a super user. */}}
{{- define "highwater.clientProperties" -}}
# The tools' client configuration (--command-config), rendered by the chart.
security.protocol=SSL
ssl.ca.location=/etc/highwater-tls/ca.crt
ssl.certificate.location=/etc/highwater-tls/tls.crt
ssl.key.location=/etc/highwater-tls/tls.key
{{- end -}}

{{/* The security volumes of a pod: the certificate's Secret, the JWKS ConfigMap (for
brokers and coordinators); pass (dict "root" $ "component" c). */}}
{{- define "highwater.securityVolumes" -}}
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "highwater.tlsSecret" .root }}
    defaultMode: 0440
{{- end }}
{{- if and .root.Values.auth.enabled .root.Values.auth.oauthbearer.jwksConfigMap (has .component (list "broker" "coordinator")) }}
- name: jwks
  configMap:
    name: {{ .root.Values.auth.oauthbearer.jwksConfigMap }}
{{- end }}
{{- if and (include "highwater.etcdTls" .root) (has .component (list "broker" "coordinator")) }}
- name: etcd-tls
  secret:
    secretName: {{ .root.Values.metadata.etcd.tls.secret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "highwater.securityMounts" -}}
{{- if .root.Values.tls.enabled }}
# A directory, not single files: the kubelet updates it in place when cert-manager
# renews the certificate, and the servers read it again at the next handshake.
- name: tls
  mountPath: /etc/highwater-tls
  readOnly: true
{{- end }}
{{- if and .root.Values.auth.enabled .root.Values.auth.oauthbearer.jwksConfigMap (has .component (list "broker" "coordinator")) }}
- name: jwks
  mountPath: /etc/highwater-jwks
  readOnly: true
{{- end }}
{{- if and (include "highwater.etcdTls" .root) (has .component (list "broker" "coordinator")) }}
# TLS to etcd: a directory too, so a renewed client certificate reaches the next connection.
- name: etcd-tls
  mountPath: /etc/highwater-etcd-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The Kafka listener's security protocol: broker.kafka.securityProtocol, or by default
SASL_SSL with auth, SSL with TLS, else PLAINTEXT (docs/kafka-protocol.md). */}}
{{- define "highwater.kafkaSecurityProtocol" -}}
{{- if .Values.broker.kafka.securityProtocol -}}
{{- .Values.broker.kafka.securityProtocol -}}
{{- else if .Values.auth.enabled -}}
SASL_SSL
{{- else if .Values.tls.enabled -}}
SSL
{{- else -}}
PLAINTEXT
{{- end -}}
{{- end -}}

{{/* Checks of tls and auth that the schema cannot express. */}}
{{- define "highwater.validateSecurity" -}}
{{- if .Values.broker.kafka.enabled -}}
{{- $protocol := include "highwater.kafkaSecurityProtocol" . -}}
{{- if and (has $protocol (list "SSL" "SASL_SSL")) (not .Values.tls.enabled) -}}
{{- fail (printf "broker.kafka.securityProtocol: %s needs tls.enabled" $protocol) -}}
{{- end -}}
{{- if and (has $protocol (list "SASL_PLAINTEXT" "SASL_SSL")) (not .Values.auth.enabled) -}}
{{- fail (printf "broker.kafka.securityProtocol: %s needs auth.enabled (its saslMechanisms)" $protocol) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.tls.enabled) -}}
{{- fail "auth.enabled: needs tls.enabled (SASL only over TLS, and the pods authenticate to each other with their certificate)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (has "OAUTHBEARER" .Values.auth.saslMechanisms) (not .Values.auth.oauthbearer.jwksConfigMap) -}}
{{- fail "auth.oauthbearer.jwksConfigMap: OAUTHBEARER is in auth.saslMechanisms but no JWKS is given to check tokens with" -}}
{{- end -}}
{{- if and .Values.auth.enabled .Values.auth.scram.usersSecret (not (has .Values.auth.scram.mechanism .Values.auth.saslMechanisms)) -}}
{{- fail (printf "auth.scram.mechanism: %s is not in auth.saslMechanisms, so its users could not log in" .Values.auth.scram.mechanism) -}}
{{- end -}}
{{- if and .Values.auth.enabled .Values.tls.existingSecret (not .Values.auth.superUsers) -}}
{{- fail "auth.superUsers: with tls.existingSecret, name the principal of its certificate (User:<its CN>): the pods speak to each other as that principal" -}}
{{- end -}}
{{- end -}}

{{/* The etcd metadata store's address (etcd://h:p,h:p/cluster), empty in KRaft mode. */}}
{{- define "highwater.metadataStore" -}}
{{- if eq .Values.metadata.mode "etcd" -}}
{{ ternary "https" "etcd" .Values.metadata.etcd.tls.enabled }}://{{ join "," .Values.metadata.etcd.endpoints }}/{{ .Values.metadata.etcd.cluster | default (include "highwater.fullname" .) }}
{{- end -}}
{{- end -}}
