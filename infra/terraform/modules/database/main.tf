# Database: RDS PostgreSQL, KMS-encrypted, the master password managed by RDS in Secrets
# Manager, automated backups (point-in-time restore), TLS enforced, reachable only from
# the cluster's nodes.

locals {
  major = split(".", var.engine_version)[0]
}

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.name}: RDS storage, Performance Insights and the master secret"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.name}-db"]

  tags = var.tags
}

resource "aws_security_group" "db" {
  #checkov:skip=CKV2_AWS_5:Attached to the instance through module.db's vpc_security_group_ids, which checkov cannot follow into a registry module.
  name_prefix = "${var.name}-db-"
  description = "PostgreSQL: only the EKS nodes may connect"
  vpc_id      = var.vpc_id
  tags        = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "from_nodes" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from the EKS nodes (pods are further limited by NetworkPolicies)"
  referenced_security_group_id = var.client_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

module "db" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/rds/aws"
  version = "6.13.1"

  identifier = var.name

  engine               = "postgres"
  engine_version       = var.engine_version
  family               = "postgres${local.major}"
  major_engine_version = local.major
  instance_class       = var.instance_class

  allocated_storage     = var.allocated_storage_gb
  max_allocated_storage = var.allocated_storage_gb * 4
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = module.kms.key_arn

  db_name  = "loraplex"
  username = "loraplex"
  port     = 5432

  manage_master_user_password                            = true
  master_user_secret_kms_key_id                          = module.kms.key_arn
  manage_master_user_password_rotation                   = true
  master_user_password_rotation_automatically_after_days = var.password_rotation_days

  multi_az               = var.multi_az
  db_subnet_group_name   = var.subnet_group_name
  vpc_security_group_ids = [aws_security_group.db.id]

  backup_retention_period          = var.backup_retention_days
  backup_window                    = "03:00-04:00"
  maintenance_window               = "Mon:04:30-Mon:05:30"
  copy_tags_to_snapshot            = true
  deletion_protection              = var.deletion_protection
  skip_final_snapshot              = false
  final_snapshot_identifier_prefix = "${var.name}-final"
  auto_minor_version_upgrade       = true

  iam_database_authentication_enabled   = true
  performance_insights_enabled          = true
  performance_insights_kms_key_id       = module.kms.key_arn
  performance_insights_retention_period = 7
  create_monitoring_role                = true
  monitoring_role_name                  = "${var.name}-rds-monitoring"
  monitoring_interval                   = 60

  enabled_cloudwatch_logs_exports        = ["postgresql", "upgrade"]
  create_cloudwatch_log_group            = true
  cloudwatch_log_group_retention_in_days = var.log_retention_days

  create_db_parameter_group = true
  parameters = [
    # api and worker pods each keep a SQLAlchemy pool (5 + 10 overflow); the stack sizes this.
    { name = "max_connections", value = tostring(var.max_connections), apply_method = "pending-reboot" },
    { name = "rds.force_ssl", value = "1", apply_method = "immediate" },
    { name = "log_min_duration_statement", value = "1000", apply_method = "immediate" },
    { name = "idle_in_transaction_session_timeout", value = "60000", apply_method = "immediate" },
  ]

  tags = var.tags
}
